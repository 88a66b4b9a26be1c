"""pip install of the library and the `csr-ros` tool (no ROS needed); colcon uses CMakeLists.txt."""

from setuptools import setup

setup()
