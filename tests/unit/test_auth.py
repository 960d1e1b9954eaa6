"""Credentials and identities (pollux.service.auth, .pki, .tls): pure checks, no servers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pollux.service import auth, pki
from pollux.service.config import TlsConfig
from pollux.service.errors import PermissionDenied
from pollux.service.tls import TlsError, TlsFiles, is_loopback


def test_a_new_token_parses_back_and_only_its_secret_matches_the_digest():
    made = auth.new_token()
    parsed = auth.parse_token(made.text)
    assert parsed is not None
    token_id, secret = parsed
    assert token_id == made.id
    assert auth.token_matches(secret, made.digest)
    assert not auth.token_matches(secret + "x", made.digest)
    assert made.text.encode() not in made.digest, "only a digest is stored"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Bearer abc",
        "pollux_",
        "pollux_0123456789ab",  # no secret
        "pollux_0123456789ab_",
        "pollux_XYZ456789abc_secret",  # not hex
        "pollux_0123_secret",  # short id
        "pollux_0123456789ab_" + "s" * 129,
    ],
)
def test_malformed_tokens_do_not_parse(text: str):
    assert auth.parse_token(text) is None


@given(st.text(max_size=80))
def test_parsing_never_raises(text: str):
    auth.parse_token(text)


def test_a_job_credential_is_valid_for_its_job_and_key_only():
    key = b"k" * 32
    credential = auth.job_credential(key, "j-1")
    assert auth.job_of_credential(key, credential) == "j-1"
    assert auth.job_of_credential(b"other" * 8, credential) is None
    forged = credential.replace("pjc.j-1.", "pjc.j-2.")
    assert auth.job_of_credential(key, forged) is None
    assert auth.job_of_credential(key, "pjc.j-1") is None
    assert auth.job_of_credential(key, "pollux_x") is None


def test_a_job_credential_acts_on_its_own_job_only():
    job = auth.Principal("j-1", auth.JOB, via="job-credential")
    auth.require_own_job(job, "j-1", "ReportMetrics")
    with pytest.raises(PermissionDenied, match="credential of job j-1 may not act on j-2"):
        auth.require_own_job(job, "j-2", "ReportMetrics")
    auth.require_own_job(auth.Principal("svc", auth.SERVICE), "j-2", "GetModel")  # not a job


def test_users_act_on_their_own_jobs_and_admins_on_all():
    alice = auth.Principal("alice", auth.USER)
    assert auth.may_act_on_job(alice, "alice")
    assert not auth.may_act_on_job(alice, "bob")
    assert auth.may_act_on_job(auth.Principal("root", auth.ADMIN), "bob")
    assert not auth.may_act_on_job(auth.Principal("alice", auth.SERVICE), "alice")
    with pytest.raises(PermissionDenied, match="belongs to bob"):
        auth.require_job_access(alice, "j-1", "bob", "CancelJob")
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        auth.require_admin(alice, "CreateToken")


def test_certificates_carry_name_and_role(tmp_path: Path):
    ca = pki.create_ca(tmp_path)
    issued = pki.issue(ca, tmp_path, "alice", "user")
    assert pki.identity_of(issued.cert.read_bytes()) == pki.Identity("alice", "user")
    assert issued.key.stat().st_mode & 0o777 == 0o600, "private keys are owner-only"
    server = pki.issue(ca, tmp_path, "scheduler", "service", hosts=("127.0.0.1", "localhost"))
    assert pki.identity_of(server.cert.read_bytes()).role == "service"
    with pytest.raises(pki.PkiError, match="role"):
        pki.issue(ca, tmp_path, "x", "root")
    with pytest.raises(pki.PkiError, match="not a usable certificate name"):
        pki.issue(ca, tmp_path, "a/b", "user")


def test_tls_files_are_reread_when_they_change(tmp_path: Path):
    ca = pki.create_ca(tmp_path)
    first = pki.issue(ca, tmp_path, "svc", "service", hosts=("127.0.0.1",))
    files = TlsFiles(ca.cert, first.cert, first.key)
    generation = files.generation
    assert not files.changed(generation)
    before = files.current().cert
    pki.issue(ca, tmp_path, "svc", "service", hosts=("127.0.0.1",))  # renewed in place
    assert files.changed(generation)
    assert files.current().cert != before


def test_tls_files_that_cannot_be_used_are_refused_with_the_file_named(tmp_path: Path):
    ca = pki.create_ca(tmp_path)
    with pytest.raises(TlsError, match=r"cannot read .*missing\.pem"):
        TlsFiles(ca.cert, tmp_path / "missing.pem", ca.key)
    (tmp_path / "junk.pem").write_text("hello")
    with pytest.raises(TlsError, match=r"junk\.pem is not a PEM certificate"):
        TlsFiles(ca.cert, tmp_path / "junk.pem", ca.key)


def test_a_half_configured_tls_section_is_a_config_problem():
    assert TlsConfig().problems() == []
    assert not TlsConfig().enabled
    problems = TlsConfig(ca_file=Path("ca.pem")).problems()
    assert problems == ["cert_file, key_file: needed too once ca_file is set"]


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:7070", True),
        ("127.5.0.1:0", True),
        ("localhost:1", True),
        ("[::1]:7070", True),
        ("0.0.0.0:7070", False),
        ("[::]:7070", False),
        (":7070", False),
        ("10.0.0.5:7070", False),
        ("node1:7070", False),
    ],
)
def test_only_loopback_binds_count_as_local(listen: str, loopback: bool):
    assert is_loopback(listen) is loopback
