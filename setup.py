"""Package discovery (the rest of the metadata is in pyproject.toml).

vitfast's own subpackages are found by setuptools, so a new folder under vitfast/ cannot be left
out of a wheel. kernels/ and export/ are top-level folders installed as vitfast.kernels and
vitfast.export (DESIGN.md section 1); pyproject.toml cannot combine that mapping with discovery.
"""

from setuptools import find_packages, setup

MAPPED = {"vitfast.kernels": "kernels", "vitfast.export": "export"}

packages = find_packages(include=["vitfast", "vitfast.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]

setup(packages=packages, package_dir={"vitfast": "vitfast", **MAPPED})
