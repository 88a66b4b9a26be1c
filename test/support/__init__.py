"""Helpers of the tests, imported as `support.<module>` (test/conftest.py puts test/ on the
path): the servers the fixtures start, the ROS graph and node processes, prompts and messages
shared by several test files. Nothing here is collected as a test."""
