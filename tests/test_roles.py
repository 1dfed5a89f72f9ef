"""The one role vocabulary (protocol.messages.Role): port offsets, binding flags and name parsing,
and that config, topology and auth read them from there."""

from __future__ import annotations

import pytest

from prl_actors.config import BINDS, ROLES, Config
from prl_actors.launch import topology
from prl_actors.protocol.messages import ADDRESSED_ROLES, BINDING_ROLES, Role, role_prefix
from prl_actors.transport.auth import role_of_name

pytestmark = pytest.mark.fast


def test_port_offsets_are_fixed_and_distinct() -> None:
    """A run's tcp addresses derive from these offsets: changing one moves a deployed actor's port."""
    offsets = {r.value: r.port_offset for r in Role if r.port_offset is not None}
    assert offsets == {"coordinator": 0, "publisher": 1, "buffer": 2, "trainer": 3, "worker": 4, "learner": 5}
    assert Role.ENV.port_offset is None and Role.OPERATOR.port_offset is None
    assert tuple(r.value for r in ADDRESSED_ROLES) == ROLES
    assert all(ROLES.index(r) == Role(r).port_offset for r in ROLES)


def test_binding_roles_one_meaning() -> None:
    assert {r.value for r in Role if r.binds} == {"coordinator", "publisher", "buffer", "learner"}
    assert tuple(r.value for r in BINDING_ROLES) == BINDS
    assert {"coordinator", "publisher", "buffer"} == topology.BINDS  # the GRPO runtime's binders
    assert Config().bound_roles() == ("coordinator", "publisher", "buffer")


def test_tcp_address_uses_the_port_offset() -> None:
    cfg = Config.model_validate({"transport": {"kind": "tcp", "base_port": 7000}})
    for r in ADDRESSED_ROLES:
        assert cfg.address(r.value).endswith(f":{7000 + (r.port_offset or 0)}")
    with pytest.raises(ValueError, match="no address of its own"):
        cfg.address("env")


@pytest.mark.parametrize(
    ("name", "role"),
    [("worker-3", Role.WORKER), ("worker-host-12", Role.WORKER), ("trainer", Role.TRAINER), ("env-a-1", Role.ENV)],
)
def test_name_to_role(name: str, role: Role) -> None:
    assert Role.of_name(name) is role and role_of_name(name) is role
    assert role_prefix(name) == topology.role_of(name) == role.value


def test_a_name_without_a_role() -> None:
    assert Role.of_name("workers-1") is None and Role.of_name("") is None
    assert role_prefix("workers-1") == "workers"
