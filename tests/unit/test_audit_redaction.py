"""Secrets a caller puts where an id belongs are audited by their id, never in full."""

from __future__ import annotations

from pollux.service.audit import redacted
from pollux.service.auth import new_token


def test_a_whole_token_given_as_a_target_keeps_its_id_and_loses_its_secret() -> None:
    token = new_token()
    text = f"RevokeToken of {token.text}; next"
    assert redacted(text) == f"RevokeToken of pollux_{token.id}_…; next"
    assert token.text.split("_", 2)[2] not in redacted(text)


def test_job_credentials_are_cut_and_other_text_is_kept() -> None:
    assert redacted("credential pjc.j-1.abcDEF-123 refused") == "credential pjc.… refused"
    for text in ("job j-3f9a1c2b", "pollux_short_x", "user alice", ""):
        assert redacted(text) == text
