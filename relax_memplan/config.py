"""Run configuration: YAML files loaded into frozen dataclasses.

The defaults live in the dataclasses, so the package needs no file at run time;
``configs/default.yaml`` in the repository spells out the same values (a test keeps the two
in step).  A config file may give any subset of the keys; unknown keys and values of the
wrong type or range raise :class:`~relax_memplan.errors.ConfigError` naming the file and
the dotted key (e.g. ``planner.alignment_bytes``).

Example::

    target: llvm
    planner:
      algorithms: [greedy_by_size]
    shapes:
      x: [5, 3, 96, 96]
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field

import yaml

from .errors import ConfigError, TargetError
from .planner import ALGORITHMS
from .targets import check_cpu, check_cuda_arch

# pipeline.CONV_CHAIN_MODES' keys (this module does not import TVM; a test checks they agree)
_CONV_CHAIN_MODES = ("auto", "memory", "off")

__all__ = ["TARGET_KINDS", "PlannerConfig", "VerifyConfig", "Config", "load_config"]

TARGET_KINDS = ("llvm", "cuda")
"""TVM target kinds a config may name."""

_MIN_ALIGNMENT_BYTES = 64  # vm.builtin.ensure_zero_offset copies tensors placed off 64 bytes
_NUMBER_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _check_int(key: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value}")
    return value


def _check_float(key: str, value, minimum: float, allow_minimum: bool) -> float:
    # PyYAML reads "1e-4" (no dot) as a string: accept numeric text.
    if isinstance(value, str) and _NUMBER_TEXT.match(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value}")
    if value < minimum or (value == minimum and not allow_minimum):
        bound = ">=" if allow_minimum else ">"
        raise ConfigError(f"{key} must be {bound} {minimum}, got {value}")
    return float(value)


STRATEGIES = ("exact", "upper_bound", "buckets")


def _check_conv_chain_mode(value) -> str:
    """``fusion_conv_chain``: one of :data:`_CONV_CHAIN_MODES`; YAML 1.1 reads a bare ``off``
    (also ``no``, ``false``) as the boolean false, taken as ``"off"`` (so that the documented
    ``fusion_conv_chain: off`` works). True (``on``/``yes``/``true``) names no mode and stays
    an error."""
    if value is False:
        return "off"
    if value is True:
        raise ConfigError(f"fusion_conv_chain: true (YAML reads on/yes/true as true) is not a "
                          f"mode; give one of {list(_CONV_CHAIN_MODES)}")
    if value not in _CONV_CHAIN_MODES:
        raise ConfigError(f"fusion_conv_chain must be one of {list(_CONV_CHAIN_MODES)}, "
                          f"got {value!r}")
    return value


def _check_buckets(key: str, value) -> dict[str, tuple[int, ...]]:
    """``{dim: [values]}`` with positive int values, sorted and de-duplicated."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping of dim name to a list of values, got {value!r}")
    out = {}
    for name, values in value.items():
        if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(f"{key}.{name} must be a non-empty list of integers, got {values!r}")
        out[str(name)] = tuple(sorted({_check_int(f"{key}.{name}[{i}]", v, 1) for i, v in enumerate(values)}))
    return out


@dataclass(frozen=True)
class PlannerConfig:
    """Settings of the arena offset planner (YAML section ``planner``).

    Attributes
    ----------
    algorithms : tuple of str or None
        Names of :data:`relax_memplan.planner.ALGORITHMS` to try, best result kept
        (the improvement search then runs in the time left); None tries all.
    strategy : str
        Plan for symbolic dims (with ``dims``/``--dim``): ``exact`` (an arena
        sized per call), ``upper_bound`` (one arena at the declared bounds) or
        ``buckets`` (``exact`` plus a plan made at each value of ``buckets``).
    buckets : dict of str to tuple of int
        Dim name -> bucket values for the ``buckets`` strategy, e.g. ``{seq: [64, 128]}``.
    size_classes : bool
        Round dynamic arenas and outputs up to geometric size classes, so TVM's
        pooled allocator keeps few distinct sizes (bounded pool).
    size_class_growth : float
        Ratio between consecutive size classes of a dim (> 1; classes go from the
        upper bound down).
    time_limit_s : float
        Time budget in seconds for the offset search of one arena; > 0.
    alignment_bytes : int
        Alignment of every tensor offset in an arena; a power of two >= 64, because
        ``vm.builtin.ensure_zero_offset`` silently copies a tensor placed off 64 bytes.
    reorder : bool
        Run :class:`~relax_memplan.transform.reorder_for_memory.ReorderForMemory` (binding
        order of least peak live bytes per dataflow block, kept only where it lowers the
        peak). On by default: it never raises the peak (by construction) and raised no
        model's latency measurably (``benchmarks/inplace_latency_bench.py``, 1 thread).
        CLI: ``--reorder`` / ``--no-reorder``.
    inplace : bool
        Let kernels write an output over an input that dies there
        (``PlanStaticMemory(inplace=True)`` and ``PlanDynamicMemory(inplace=True)``,
        :mod:`relax_memplan.analysis.inplace`). On by default, on the same measurements;
        the Python API's passes keep ``inplace=False`` unless given.
        CLI: ``--inplace`` / ``--no-inplace``.
    concat_inplace : bool
        Write concatenations in place (``PlanStaticMemory(concat_inplace=True)``,
        :mod:`relax_memplan.transform._concat_plan`): its own key, not ``inplace``, because it
        is independent of the elementwise rule (either may be on alone; with both, an input
        or output of a concat that in-place reuse would overwrite is refused). Static plans
        only. On by default: ``models_bench.py --lower-bounds`` verifies all 10 shared models
        against onnxruntime with it (squeezenet 8 and yolov8n 9 concats in place) and
        ``inplace_latency_bench.py --concat`` measured no latency change on yolov8n (0.998x);
        the Python API's ``PlanStaticMemory`` keeps ``concat_inplace=False`` unless given.
    """

    algorithms: tuple[str, ...] | None = None
    strategy: str = "exact"
    time_limit_s: float = 1.0
    alignment_bytes: int = 64
    buckets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    size_classes: bool = False
    size_class_growth: float = 4.0
    reorder: bool = True
    inplace: bool = True
    concat_inplace: bool = True

    def __post_init__(self):
        object.__setattr__(self, "buckets", _check_buckets("planner.buckets", self.buckets))
        for key in ("reorder", "inplace", "concat_inplace"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"planner.{key} must be true or false, "
                                  f"got {getattr(self, key)!r}")
        if not isinstance(self.size_classes, bool):
            raise ConfigError(f"planner.size_classes must be true or false, got {self.size_classes!r}")
        object.__setattr__(self, "size_class_growth", _check_float(
            "planner.size_class_growth", self.size_class_growth, 1.0, allow_minimum=False))
        if self.strategy == "buckets" and not self.buckets:
            raise ConfigError("planner.strategy buckets needs planner.buckets, e.g. {seq: [64, 128]}")
        algorithms = self.algorithms
        if algorithms is not None:
            if isinstance(algorithms, str) or not isinstance(algorithms, (list, tuple)):
                raise ConfigError(
                    f"planner.algorithms must be a list of names or null, got {algorithms!r}"
                )
            for name in algorithms:
                if not isinstance(name, str) or not name:
                    raise ConfigError(f"planner.algorithms has a non-name entry {name!r}")
                if name not in ALGORITHMS:
                    raise ConfigError(
                        f"planner.algorithms: unknown algorithm {name!r}; "
                        f"known: {', '.join(sorted(ALGORITHMS))}"
                    )
            if not algorithms:
                raise ConfigError("planner.algorithms is empty; use null for all algorithms")
            object.__setattr__(self, "algorithms", tuple(algorithms))
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"planner.strategy must be one of {', '.join(STRATEGIES)}, "
                              f"got {self.strategy!r}")
        limit = _check_float("planner.time_limit_s", self.time_limit_s, 0.0, allow_minimum=False)
        object.__setattr__(self, "time_limit_s", limit)
        alignment = _check_int("planner.alignment_bytes", self.alignment_bytes, 1)
        if alignment < _MIN_ALIGNMENT_BYTES or alignment & (alignment - 1):
            raise ConfigError(
                f"planner.alignment_bytes must be a power of two >= {_MIN_ALIGNMENT_BYTES}, "
                f"got {alignment}"
            )


@dataclass(frozen=True)
class VerifyConfig:
    """Settings of the numerical check against onnxruntime (YAML section ``verify``).

    An output passes when ``max|out - ref| <= rtol * max|ref| + atol``.

    Attributes
    ----------
    rtol : float
        Relative tolerance, >= 0.
    atol : float
        Absolute tolerance, >= 0.
    seed : int
        Seed of the random inputs, >= 0.
    """

    rtol: float = 1.0e-4
    atol: float = 1.0e-5
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "rtol", _check_float("verify.rtol", self.rtol, 0.0, True))
        object.__setattr__(self, "atol", _check_float("verify.atol", self.atol, 0.0, True))
        _check_int("verify.seed", self.seed, 0)


@dataclass(frozen=True)
class Config:
    """A whole run configuration.

    Attributes
    ----------
    target : str
        TVM target kind, one of :data:`TARGET_KINDS`.
    cuda_arch : str or None
        CUDA arch of a ``cuda`` build (``sm_80``, ``sm_90a``; as ``--cuda-arch``); null: the
        installed GPU's, else :data:`relax_memplan.targets.DEFAULT_CUDA_ARCH` (``sm_80``).
        Ignored for ``llvm``.
    cpu : str
        CPU of an ``llvm`` build (as ``--cpu``): ``host`` (this machine's, the default),
        ``portable`` (any CPU of the architecture) or an LLVM CPU name such as
        ``skylake-avx512``. Ignored for ``cuda``.
    planner : PlannerConfig
        Offset planner settings.
    shapes : dict of str to tuple of int
        Input name to full input shape (same meaning as ``--shape``); dims > 0.
    dims : dict of str to (int, int or None[, int])
        Symbolic dim name to its declared range ``[lower, upper]`` (inclusive,
        elements; ``upper`` may be null) or ``[lower, upper, step]``, as
        ``--dim NAME=LO..HI[:STEP]``: the model is then compiled once with those
        dims symbolic.
    dispatch : dict of str to tuple of int
        Kernel specialization: dim name -> bucket values (``{seq: [64, 128]}``);
        each kernel using the dim gets a version per value plus the generic one,
        chosen at run time.
    schedule : bool
        Apply our CPU schedules (llvm; :mod:`relax_memplan.schedules`); on by default,
        ``false`` gives TVM's unscheduled kernels (as ``--no-schedule``).
    check_indices : bool
        Check index values (Gather ids, ...) at run time where they are not proved in range
        (:class:`~relax_memplan.transform.check_index_bounds.CheckIndexBounds`); ``false``
        as ``--no-index-checks``.
    fusion : bool
        Our graph-level fusion before ``LegalizeOps`` (``get_pipeline(fusion=True)``: dropout
        removal, attention as one kernel on CPU and CUDA); on by default (the fused attention
        measured faster than the kernels it replaces at every seq, ``attention_bench.py``).
    fusion_conv_chain : {"auto", "memory", "off"}
        With ``fusion``, which conv chains
        :class:`~relax_memplan.transform.fuse_conv_chain.FuseConvChain` fuses (llvm only):
        ``auto`` where measured not slower (depthwise strided consumers; dense ones too without
        ``schedule``), ``memory`` into any strided conv (lowest peak, slower kernels for dense
        consumers with ``schedule``), ``off`` none
        (:data:`~relax_memplan.pipeline.CONV_CHAIN_MODES`).
    verify : VerifyConfig
        Numerical check settings.
    """

    target: str = "llvm"
    cuda_arch: str | None = None
    cpu: str = "host"
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dims: dict[str, tuple] = field(default_factory=dict)
    dispatch: dict[str, tuple[int, ...]] = field(default_factory=dict)
    schedule: bool = True
    check_indices: bool = True
    fusion: bool = True
    fusion_conv_chain: str = "auto"
    verify: VerifyConfig = field(default_factory=VerifyConfig)

    def __post_init__(self):
        object.__setattr__(self, "dispatch", _check_buckets("dispatch", self.dispatch))
        if not isinstance(self.schedule, bool):
            raise ConfigError(f"schedule must be true or false, got {self.schedule!r}")
        if not isinstance(self.fusion, bool):
            raise ConfigError(f"fusion must be true or false, got {self.fusion!r}")
        object.__setattr__(self, "fusion_conv_chain",
                           _check_conv_chain_mode(self.fusion_conv_chain))
        if not isinstance(self.check_indices, bool):
            raise ConfigError(f"check_indices must be true or false, got {self.check_indices!r}")
        if self.target not in TARGET_KINDS:
            raise ConfigError(f"target must be one of {list(TARGET_KINDS)}, got {self.target!r}")
        if self.cuda_arch is not None:
            try:
                check_cuda_arch(self.cuda_arch, option="cuda_arch")
            except TargetError as err:
                raise ConfigError(str(err)) from None
        try:
            check_cpu(self.cpu, option="cpu")
        except TargetError as err:
            raise ConfigError(str(err)) from None
        for key, cls in (("planner", PlannerConfig), ("verify", VerifyConfig)):
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"{key} must be a {cls.__name__}, got {getattr(self, key)!r}")
        if not isinstance(self.shapes, dict):
            raise ConfigError(
                f"shapes must be a mapping of input name to dims, got {self.shapes!r}"
            )
        shapes = {}
        for name, dims in self.shapes.items():
            key = f"shapes.{name}"
            if not isinstance(name, str):
                raise ConfigError(f"shapes key {name!r} must be an input name (a string)")
            if isinstance(dims, str) or not isinstance(dims, (list, tuple)):
                raise ConfigError(f"{key} must be a list of integers, got {dims!r}")
            shapes[name] = tuple(_check_int(f"{key}[{i}]", d, 1) for i, d in enumerate(dims))
        object.__setattr__(self, "shapes", shapes)
        if not isinstance(self.dims, dict):
            raise ConfigError(f"dims must be a mapping of dim name to [lower, upper], got {self.dims!r}")
        dims = {}
        for name, bounds in self.dims.items():
            key = f"dims.{name}"
            if isinstance(bounds, str) or not isinstance(bounds, (list, tuple)) or len(bounds) not in (2, 3):
                raise ConfigError(f"{key} must be [lower, upper] or [lower, upper, step] "
                                  f"(upper may be null without a step), got {bounds!r}")
            lower = _check_int(f"{key}[0]", bounds[0], 1)  # like shapes: no zero-size dims
            upper = None if bounds[1] is None else _check_int(f"{key}[1]", bounds[1], lower)
            if len(bounds) == 3:
                step = _check_int(f"{key}[2]", bounds[2], 1)
                if upper is None:
                    raise ConfigError(f"{key}: a step needs an upper bound")
                dims[str(name)] = (lower, upper, step) if step > 1 else (lower, upper)
            else:
                dims[str(name)] = (lower, upper)
        object.__setattr__(self, "dims", dims)

    def pipeline_options(self, planner: str = "relax_memplan"):
        """This configuration's :class:`~relax_memplan.pipeline.PipelineOptions` for a build
        with ``planner`` (the CLI replaces the fields its flags give).

        Raises
        ------
        ValueError
            An unknown planner.
        """
        from .pipeline.options import PipelineOptions  # imports TVM: only when asked

        return PipelineOptions(planner=planner, schedule=self.schedule, fusion=self.fusion,
                               fusion_conv_chain=self.fusion_conv_chain,
                               check_indices=self.check_indices, dim_ranges=dict(self.dims),
                               dispatch=dict(self.dispatch))

    def replace_from_cli(
        self,
        *,
        target: str | None = None,
        algorithms: tuple[str, ...] | None = None,
        time_limit_s: float | None = None,
        alignment_bytes: int | None = None,
        shapes: dict[str, tuple[int, ...]] | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        seed: int | None = None,
    ) -> Config:
        """Return a copy with the command-line options that were given (not None) applied.

        ``shapes`` is merged into the config's shapes, replacing inputs named in both.
        Values are validated as in a file.

        Raises
        ------
        ConfigError
            When an override has the wrong type or range.
        """

        def given(**values):
            return {key: value for key, value in values.items() if value is not None}

        planner = dataclasses.replace(
            self.planner,
            **given(
                algorithms=algorithms,
                time_limit_s=time_limit_s,
                alignment_bytes=alignment_bytes,
            ),
        )
        verify = dataclasses.replace(self.verify, **given(rtol=rtol, atol=atol, seed=seed))
        merged_shapes = {**self.shapes, **(shapes or {})}
        return dataclasses.replace(
            self, **given(target=target), planner=planner, verify=verify, shapes=merged_shapes
        )

    def to_dict(self) -> dict:
        """The config as plain YAML-ready data (lists, not tuples), in the file layout."""
        planner = dataclasses.asdict(self.planner)
        if planner["algorithms"] is not None:
            planner["algorithms"] = list(planner["algorithms"])
        planner["buckets"] = {name: list(v) for name, v in self.planner.buckets.items()}
        return {
            "target": self.target,
            "cuda_arch": self.cuda_arch,
            "cpu": self.cpu,
            "planner": planner,
            "shapes": {name: list(dims) for name, dims in self.shapes.items()},
            "dims": {name: list(bounds) for name, bounds in self.dims.items()},
            "dispatch": {name: list(v) for name, v in self.dispatch.items()},
            "schedule": self.schedule,
            "check_indices": self.check_indices,
            "fusion": self.fusion,
            "fusion_conv_chain": self.fusion_conv_chain,
            "verify": dataclasses.asdict(self.verify),
        }


_SECTIONS = {"planner": PlannerConfig, "verify": VerifyConfig}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the
    last value silently, so ``inplace: true`` then ``inplace: false`` would build unnoticed
    with whichever came last."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                break  # the base class reports an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}): keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Load a YAML config file; keys it does not give keep their defaults.

    Parameters
    ----------
    path : str or os.PathLike, optional
        The YAML file.  None returns the defaults (``Config()``) without reading a file.

    Returns
    -------
    Config
        The validated, frozen config.

    Raises
    ------
    ConfigError
        When the file is missing or not valid YAML, the top level or a section is not a
        mapping, a key is unknown (the message lists the valid keys), or a value has the
        wrong type or range.  Every message starts with the file path.
    """
    if path is None:
        return Config()
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.load(stream, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file: {err.strerror}") from err
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text (UTF-8) YAML file") from None
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ConfigError(f"{path}: not valid YAML: {detail}") from err
    try:
        return _config_from_data({} if data is None else data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _config_from_data(data) -> Config:
    _check_keys("top level", data, Config)
    kwargs = dict(data)
    for key, cls in _SECTIONS.items():
        if key in kwargs:
            section = {} if kwargs[key] is None else kwargs[key]
            _check_keys(key, section, cls, prefix=f"{key}.")
            kwargs[key] = cls(**section)
    for key in ("shapes", "dims", "dispatch"):
        if key in kwargs and kwargs[key] is None:
            kwargs.pop(key)
    return Config(**kwargs)


def _check_keys(where: str, data, cls, prefix: str = "") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in valid:
            raise ConfigError(
                f"unknown key '{prefix}{key}'; valid keys here: {', '.join(valid)}"
            )
