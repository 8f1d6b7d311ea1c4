"""`vitfast.pytriton_adapter`: the private PyTriton hook is used only on tested versions, with a fallback."""

from __future__ import annotations

import types

from vitfast import pytriton_adapter as adapter


class FakeModel:
    model_name, model_version = "vit", 1

    def get_proxy_model_files(self):
        return {"file:1/model.py": b"proxy"}


def triton_with(*models):
    return types.SimpleNamespace(_model_manager=types.SimpleNamespace(models=list(models)))


def add_guard(files, version):
    return files | {f"file:{version}/guard.py": b"guard"}


def test_tested_version_rewrites_the_files():
    model = FakeModel()
    assert adapter.rewrite_model_files(triton_with(model), {"vit"}, add_guard, version=(0, 7, 0)) is None
    assert model.get_proxy_model_files() == {"file:1/model.py": b"proxy", "file:1/guard.py": b"guard"}


def test_untested_version_changes_nothing_and_says_why():
    model = FakeModel()
    problem = adapter.rewrite_model_files(triton_with(model), {"vit"}, add_guard, version=(0, 8, 1))
    assert "0.8.1 is untested" in problem and "0.7" in problem
    assert model.get_proxy_model_files() == {"file:1/model.py": b"proxy"}


def test_moved_internals_change_nothing_and_say_why():
    assert "does not expose its model files" in adapter.rewrite_model_files(types.SimpleNamespace(), {"vit"}, add_guard, version=(0, 7, 0))
    other = FakeModel()
    other.model_name = "other"
    assert adapter.rewrite_model_files(triton_with(other), {"vit"}, add_guard, version=(0, 7, 0)) is not None


def test_installed_version_matches_the_pin():
    version = adapter.installed_version()
    if version is not None:  # the test extra installs nvidia-pytriton on Linux x86_64/aarch64
        assert adapter.is_tested(version), f"nvidia-pytriton {version} is installed but outside {adapter.TESTED}"
