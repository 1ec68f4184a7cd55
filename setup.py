# All metadata lives in setup.cfg; this shim lets older pip versions install in editable mode.
from setuptools import setup

setup()
