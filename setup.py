"""setuptools finds autolade's code packages; the three data-only packages (the top-level
policies/, profiles/ and custom_generate/ folders, shipped as autolade._shipped.*) are mapped in
pyproject.toml's [tool.setuptools.package-dir] and named here, since find_packages cannot see
through that mapping. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

SHIPPED = ["autolade._shipped.policies", "autolade._shipped.profiles", "autolade._shipped.custom_generate"]

setup(packages=find_packages(include=["autolade", "autolade.*"]) + SHIPPED)
