"""``horovod.common``: the pieces of Horovod's common code that its users and test suites import."""
