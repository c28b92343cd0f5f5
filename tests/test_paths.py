from pathlib import Path

from autolade.paths import repo_policies_dir, repo_profiles_dir, user_dir


def test_user_dir_honours_autolade_home(tmp_path, monkeypatch):
    home = tmp_path / "state" / "autolade"
    monkeypatch.setenv("AUTOLADE_HOME", str(home))
    assert user_dir() == home
    assert home.is_dir()  # created on first use


def test_user_dir_default_is_under_home_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOLADE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_dir() == tmp_path / ".cache" / "autolade"
    assert user_dir().is_dir()


def test_repo_dirs_sit_at_the_checkout_root():
    root = Path(__file__).resolve().parent.parent
    assert repo_profiles_dir() == root / "profiles"
    assert repo_policies_dir() == root / "policies"
