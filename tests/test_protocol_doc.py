"""docs/PROTOCOL.md's generated tables match the code (routes and vocabularies)."""

from __future__ import annotations

import pytest

from prl_actors.protocol import doc
from prl_actors.protocol.messages import ErrorCode, RejectReason

pytestmark = pytest.mark.fast


def test_protocol_page_matches_the_code() -> None:
    page = doc.PAGE.read_text()
    assert doc.generated() in page, "docs/PROTOCOL.md is stale: run `python -m prl_actors.protocol.doc --write`"


def test_generated_block_lists_every_reason_and_code() -> None:
    block = doc.generated()
    for member in [*RejectReason, *ErrorCode]:
        assert f"| `{member.value}` | {member.description} |" in block


def test_replace_block_is_idempotent_and_keeps_the_hand_written_part() -> None:
    page = "# Title\n\nhand-written\n"
    once = doc.replace_block(page)
    assert once.startswith(page.rstrip("\n")) and doc.replace_block(once) == once
