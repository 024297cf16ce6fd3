"""Install relax_memplan: memory planning and shape dispatch passes for Apache TVM Relax."""

import re
from pathlib import Path

from setuptools import find_packages, setup

# the version is written once, in relax_memplan/_version.py (read without importing TVM)
VERSION = re.search(r'__version__ = "([^"]+)"',
                    Path(__file__).with_name("relax_memplan").joinpath("_version.py").read_text()).group(1)

setup(
    name="relax_memplan",
    version=VERSION,
    description="Arena memory planning, liveness analysis and reports for Apache TVM Relax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["relax_memplan", "relax_memplan.*"]),
    py_modules=["relax_memplan_launch"],  # the console entry: Ctrl-C while TVM loads
    install_requires=[
        "apache-tvm==0.27.0.post1",
        "numba>=0.61",
        "numpy",
        "onnx",
        "PyYAML",
    ],
    extras_require={
        "test": ["pytest", "onnxruntime", "hypothesis", "matplotlib", "nbclient", "nbformat", "ipykernel"],
        "plot": ["matplotlib"],
        "bench": ["omnimalloc==1.0.0"],
    },
    entry_points={"console_scripts": ["relax-memplan=relax_memplan_launch:main"]},
)
