"""The compiled library as a file and as a process: what ``compile -o`` writes beside it and
how ``run``, the benchmarks and Python callers load it.

- :mod:`.manifest` -- ``model.so.json``, written beside each library: the library's size and
  SHA-256, the model's inputs (names, dtypes, shapes with symbolic dims and their declared
  ranges), the target and the package and TVM versions; :func:`verify_library` checks a
  library against it before anything maps the file;
- :mod:`.inputs` -- the manifest's inputs from a Relax function's signature, and the values
  given for a call checked against them;
- :mod:`.loader` -- :func:`load_library` (verify, load with ``tvm.runtime.load_module``, drop
  the file pages of the embedded constants so that the weights are resident once, make a
  Relax VM) and :func:`release_embedded_constants` for a module loaded with TVM directly;
- :mod:`.elf` -- a library file checked whole before the dynamic loader maps it, and its
  format told by its first bytes.

The bytes a call keeps resident (constants, workspace) are :mod:`relax_memplan.analysis.resident`.
"""

from .loader import LoadedLibrary, load_library, release_embedded_constants
from .manifest import (MANIFEST_SUFFIX, LibraryManifest, ManifestInput, manifest_path,
                       read_manifest, verify_library, write_manifest)

__all__ = ["LibraryManifest", "LoadedLibrary", "MANIFEST_SUFFIX", "ManifestInput",
           "load_library", "manifest_path", "read_manifest", "release_embedded_constants",
           "verify_library", "write_manifest"]
