import pytest

from testbed.stack import Stack


@pytest.fixture
def stack_of():
    """Starts a stack with the given plugin configuration; stops it after the test."""
    started = []

    def make(plugin, gateways=1, **options):
        stack = Stack(plugin, gateways=gateways, **options)
        started.append(stack)
        return stack.start()

    yield make
    for stack in started:
        stack.close()


@pytest.fixture
def stack_of_cluster():
    """A one-gateway stack whose bridge uses a (started) ValkeyCluster."""
    started = []

    def make(plugin, cluster):
        stack = Stack(plugin, gateways=1, cluster=cluster)
        started.append(stack)
        return stack.start()

    yield make
    for stack in started:
        stack.close()
