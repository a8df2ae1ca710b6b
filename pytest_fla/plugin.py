"""pytest-fla's pytest entry point."""


def pytest_configure(config):
    config.addinivalue_line("markers", "fla_op(name): the op a conformance test checks (for reports)")
