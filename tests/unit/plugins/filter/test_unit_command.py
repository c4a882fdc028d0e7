"""The recorded baseline's command line as systemd reads it from the unit file (pivot.ops.unit_command): what is
validated is the file a rollback starts, read with systemd's rules, and what the reader cannot read exactly is said,
never guessed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from ansible_collections.pivot.ops.plugins.filter.unit_command import unit_command
from ansible_collections.pivot.ops.plugins.filter.unit_drift import unit_drift

REPO = Path(__file__).resolve().parents[4]
LAB_USER_UNIT = REPO / "lab" / "files" / "sglang-nextn.service"
USER_ARGV = ["/root/ml-env/bin/python3", "-m", "sglang.launch_server", "--model-path", "/root/models/Qwen3.6-27B",
             "--port", "30000", "--host", "0.0.0.0", "--tp-size", "2", "--mem-fraction-static", "0.88",
             "--context-length", "131072", "--max-running-requests", "16", "--mamba-full-memory-ratio", "0.5",
             "--mamba-scheduler-strategy", "extra_buffer", "--reasoning-parser", "qwen3", "--tool-call-parser",
             "qwen3_coder", "--speculative-algo", "NEXTN", "--speculative-num-steps", "3",
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def shown(argv: list[str], path: str | None = None) -> str:
    """ExecStart as `systemctl show` prints it (argv joined with bare spaces)."""
    return (f"{{ path={path or argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; start_time=[n/a] ; "
            "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")


def service(*lines: str) -> str:
    return "\n".join(["[Unit]", "Description=x", "", "[Service]", *lines, "", "[Install]",
                      "WantedBy=multi-user.target"])


def test_the_users_unit_in_the_lab_reads_as_its_command_line() -> None:
    command = unit_command(LAB_USER_UNIT.read_text())
    assert command["problem"] == ""
    assert command["argv"] == USER_ARGV and command["executable"] == USER_ARGV[0]
    assert command["environment"] == {"CUDA_VISIBLE_DEVICES": "0,1", "FAKE_NVIDIA_STATE_DIR": "/run/fake-nvidia"}
    assert command["sglang_environment"] == {}
    assert unit_command(LAB_USER_UNIT.read_text(), shown(USER_ARGV))["problem"] == ""


def test_continued_lines_quotes_and_escapes_read_as_systemd_reads_them() -> None:
    text = service(
        "ExecStart=/v/bin/python3 -m sglang.launch_server \\",
        "    --model-path '/m/with space' \\",
        "# a comment inside the continued line is dropped",
        "    --json-model-override-args \"{\\\"a\\\": 1}\" \\",
        "    --served-model-name a'b'\"c d\" --x=\\x41\\t%% --cost $$5",
    )
    command = unit_command(text)
    assert command["problem"] == ""
    assert command["argv"] == ["/v/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m/with space",
                               "--json-model-override-args", '{"a": 1}', "--served-model-name", "abc d",
                               "--x=A\t%", "--cost", "$5"]


def test_the_units_rendered_by_pivot_read_back_as_rendered() -> None:
    """sglang.service.j2 quotes each word with ansible.builtin.quote and continues the line with a backslash."""
    argv = ["/opt/pivot/venvs/r/bin/python3", "-m", "sglang.launch_server", "--chat-template", "it's here",
            "--config", "/etc/sglang/secrets.yaml"]
    command = unit_command(service("ExecStart=" + " \\\n    ".join(shlex.quote(word) for word in argv)))
    assert command["argv"] == argv and command["problem"] == ""


def test_prefixes_are_not_part_of_the_command_and_at_names_argv0() -> None:
    assert unit_command(service("ExecStart=-/v/bin/python3 -m x"))["argv"] == ["/v/bin/python3", "-m", "x"]
    command = unit_command(service("ExecStart=@/v/bin/python3 sglang-server -m x"))
    assert command["executable"] == "/v/bin/python3" and command["argv"] == ["sglang-server", "-m", "x"]


def test_the_last_exec_start_after_a_reset_counts_and_environment_assignments_accumulate() -> None:
    command = unit_command(service(
        "ExecStart=/old/python -m old", "ExecStart=", "ExecStart=/new/python -m new",
        "Environment=A=1 \"B=two words\"", "Environment=A=3", "EnvironmentFile=-/etc/default/sglang",
    ))
    assert command["argv"] == ["/new/python", "-m", "new"]
    assert command["environment"] == {"A": "3", "B": "two words"}
    assert command["environment_files"] == ["-/etc/default/sglang"]
    assert unit_command(service("Environment=A=1", "Environment=", "Environment=B=2",
                                "ExecStart=/p -m x"))["environment"] == {"B": "2"}


def test_what_is_recorded_and_validated_of_the_environment_is_sglangs_part_without_secrets() -> None:
    command = unit_command(service("Environment=SGLANG_PLUGINS=mine DDTREE_BUDGET=64 HF_TOKEN=t SGLANG_API_KEY=k",
                                   "Environment=PATH=/bin", "ExecStart=/p -m x"))
    assert command["sglang_environment"] == {"SGLANG_PLUGINS": "mine", "DDTREE_BUDGET": "64"}


def test_other_sections_do_not_count() -> None:
    text = "[Unit]\nExecStart=/not/this -m x\n[Service]\nExecStart=/this -m x\n"
    assert unit_command(text)["argv"] == ["/this", "-m", "x"]


@pytest.mark.parametrize(("lines", "said"), [
    (["ExecStart=/v/bin/python3 -m x --name %n"], "the specifier %n"),
    (["ExecStart=/v/bin/python3 -m x --port ${PORT}"], "uses an environment variable"),
    (["ExecStart=/v/bin/python3 -m x $ARGS"], "uses an environment variable"),
    (["ExecStart=python3 -m x"], "runs 'python3' by name"),
    (["ExecStart=/v/bin/python3 -m x ; /bin/true"], "several commands"),
    (["ExecStart=/v/bin/python3 -m x", "ExecStart=/v/bin/python3 -m y"], "2 ExecStart= lines"),
    (["ExecStart=/v/bin/python3 -m x --a 'open"], "a ' quote is not closed"),
    (["ExecStart=/v/bin/python3 -m x --a \\q"], "the escape \\q"),
    (["Type=simple"], "no ExecStart= in [Service]"),
])
def test_what_the_reader_does_not_model_is_said_not_guessed(lines: list[str], said: str) -> None:
    problem = unit_command(service(*lines))["problem"]
    assert problem.startswith("Pivot cannot read its command line exactly: ") and said in problem, problem


def test_a_colon_prefix_keeps_dollar_signs_literal() -> None:
    assert unit_command(service("ExecStart=:/v/bin/python3 -m x $HOME"))["argv"] == ["/v/bin/python3", "-m", "x",
                                                                                     "$HOME"]


def test_systemd_running_something_else_than_the_file_is_a_problem() -> None:
    """A drop-in overriding ExecStart, or an edit systemd has not loaded: the file is not what runs."""
    text = service("ExecStart=/v/bin/python3 -m sglang.launch_server --port 30000")
    overridden = shown(["/v/bin/python3", "-m", "sglang.launch_server", "--port", "30001"])
    problem = unit_command(text, overridden)["problem"]
    assert "systemd runs '/v/bin/python3 -m sglang.launch_server --port 30001'" in problem
    assert "the unit file says '/v/bin/python3 -m sglang.launch_server --port 30000'" in problem
    assert "a drop-in or an edit not yet loaded (systemctl daemon-reload)" in problem
    two = "{ path=/a ; argv[]=/a ; ignore_errors=no ; x } ; { path=/b ; argv[]=/b ; ignore_errors=no ; x }"
    assert unit_command(text, two)["problem"]
    assert unit_command(text, "garbage")["problem"].endswith("which is not one command")


# --- unit_drift: what systemd would run is what Pivot rendered or recorded -------------------------------------------

RECORD = {"source": "rendered", "argv": ["/v/bin/python3", "-m", "sglang.launch_server", "--port", "30000"],
          "environment": {"DDTREE_BUDGET": "64", "SGLANG_PLUGINS": "ddtree"}}
RENDERED_UNIT = service("EnvironmentFile=/etc/sglang/releases/r/environment",
                        "ExecStart=" + " \\\n    ".join(shlex.quote(word) for word in RECORD["argv"]))
RENDERED_ENVIRONMENT = "# Ansible managed\nDDTREE_BUDGET=64\nSGLANG_PLUGINS=ddtree\n"
LOADED = {"ExecStart": shown(RECORD["argv"]), "NeedDaemonReload": "no", "DropInPaths": ""}


def test_a_unit_that_is_what_pivot_rendered_has_no_drift() -> None:
    assert unit_drift(RECORD, LOADED, unit_text=RENDERED_UNIT, environment_text=RENDERED_ENVIRONMENT) == []
    assert unit_drift(RECORD, LOADED) == []


def test_a_changed_unit_file_systemd_has_not_reloaded_is_named() -> None:
    """The stale unit: the file was re-rendered, systemd still runs the old one."""
    old = {**LOADED, "NeedDaemonReload": "yes", "ExecStart": shown([*RECORD["argv"][:-1], "30001"])}
    problems = unit_drift(RECORD, old)
    assert any("NeedDaemonReload=yes" in problem for problem in problems), problems
    assert any("systemd has loaded another command line than Pivot rendered: '30001' where it should be '30000'"
               in problem for problem in problems), problems


def test_drop_ins_are_named() -> None:
    with_drop_in = {**LOADED, "DropInPaths": "/etc/systemd/system/sglang.service.d/override.conf"}
    (problem,) = unit_drift(RECORD, with_drop_in)
    assert problem.startswith("drop-ins change the unit (/etc/systemd/system/sglang.service.d/override.conf)")


def test_a_hand_edit_of_a_recorded_unit_names_the_words_that_changed() -> None:
    recorded = {"source": "recorded", "argv": USER_ARGV, "environment": {}}
    edited = LAB_USER_UNIT.read_text().replace("--mem-fraction-static 0.88", "--mem-fraction-static 0.5")
    (problem,) = unit_drift(recorded, {}, unit_text=edited)
    assert problem == ("its unit file's ExecStart= is not the command line Pivot recorded: '0.5' where it should be "
                       "'0.88'")
    added = LAB_USER_UNIT.read_text().replace("[Service]", "[Service]\nEnvironment=SGLANG_PLUGINS=ddtree")
    (problem,) = unit_drift(recorded, {}, unit_text=added)
    assert problem.endswith("environment is not the one Pivot recorded: SGLANG_PLUGINS=ddtree added")
    assert unit_drift(recorded, {}, unit_text=LAB_USER_UNIT.read_text()) == []


def test_a_rendered_environment_file_edited_by_hand_is_named() -> None:
    edited = RENDERED_ENVIRONMENT.replace("DDTREE_BUDGET=64", "DDTREE_BUDGET=256")
    (problem,) = unit_drift(RECORD, LOADED, unit_text=RENDERED_UNIT, environment_text=edited)
    assert problem.endswith("DDTREE_BUDGET=256 where it should be 64")
    (problem,) = unit_drift(RECORD, LOADED, unit_text=RENDERED_UNIT, environment_text="SGLANG_PLUGINS=ddtree\n")
    assert problem.endswith("DDTREE_BUDGET missing")


def test_words_added_or_removed_are_named() -> None:
    argv = RECORD["argv"]
    (problem,) = unit_drift(RECORD, {"ExecStart": shown([*argv, "--api-key", "x"])})
    assert problem.endswith("'--api-key x' added")
    (problem,) = unit_drift(RECORD, {"ExecStart": shown(argv[:3])})
    assert problem.endswith("'--port 30000' missing")
    assert unit_drift(RECORD, {"ExecStart": "garbage"})
