"""The lab's three hosts are real systemd hosts, reachable the way production hosts are."""

from __future__ import annotations

import base64
import json
import os

import labctl
import pytest
import yaml

pytestmark = pytest.mark.usefixtures("lab_up")


@pytest.mark.parametrize("host", labctl.HOSTS)
def test_host_runs_systemd_as_pid1_and_is_running(host: str) -> None:
    result = labctl.ssh(host, "cat /proc/1/comm; systemctl is-system-running; hostname")
    assert result.rc == 0, result.stderr
    assert result.stdout.split() == ["systemd", "running", host]


def test_pct_exec_runs_inside_ct200_not_on_the_node() -> None:
    result = labctl.pct_exec(["sh", "-c", "hostname; cat /proc/1/comm; systemctl is-system-running"])
    assert result.rc == 0, result.stderr
    assert result.stdout.split() == ["ct200", "systemd", "running"]


def test_pct_exec_passes_stdin_stdout_stderr_and_exit_status() -> None:
    script = "cat; echo to-stderr >&2; exit 7"
    result = labctl.pct_exec(["sh", "-c", script], stdin="line one\nline two\n")
    assert result.rc == 7
    assert result.stdout == "line one\nline two\n"
    assert result.stderr == "to-stderr\n"


def test_pct_exec_keeps_every_argument_intact() -> None:
    args = ["a b", "it's", '"quoted"', "$HOME", "*", "", "semi;colon", "new\nline"]
    result = labctl.pct_exec(["python3", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *args])
    assert result.rc == 0, result.stderr
    assert json.loads(result.stdout) == args


def test_pct_moves_files_the_way_the_connection_plugin_does() -> None:
    payload = "".join(f"{i:05d} pivot\n" for i in range(20000))  # ~240 kB, several SSH windows
    write = labctl.pct_exec(["sh", "-c", "cat > /tmp/pct-copy"], stdin=payload)
    assert write.rc == 0, write.stderr
    read = labctl.pct_exec(["cat", "/tmp/pct-copy"])
    assert read.stdout == payload


def test_pct_refuses_an_unknown_container() -> None:
    result = labctl.ssh("pve", "pct exec 999 -- true")
    assert result.rc != 0
    assert "999" in result.stderr


def test_pct_status_reports_the_container_running() -> None:
    assert labctl.ssh("pve", "pct status 200").stdout.strip() == "status: running"


@pytest.mark.parametrize("host", ["ct200", "pro6000", "pve"])
def test_ansible_reaches_each_host_over_its_inventory_connection(host: str) -> None:
    result = labctl.ansible_adhoc(host, "ansible.builtin.setup", "gather_subset=min")
    assert not result.get("failed") and not result.get("unreachable"), result
    facts = result["ansible_facts"]
    assert facts["ansible_hostname"] == host
    assert facts["ansible_service_mgr"] == "systemd"


def test_lab_inventory_has_the_structure_of_production() -> None:
    production = yaml.safe_load((labctl.REPO / "inventory/production/hosts.yml").read_text())
    lab = yaml.safe_load((labctl.REPO / "inventory/lab/hosts.yml").read_text())
    # Only addresses, keys and lab-only variables may differ.
    may_differ = {"ansible_host", "ansible_private_key_file", "ansible_ssh_private_key_file",
                  "ansible_ssh_common_args", "ansible_host_key_checking"}
    lab_only = {"pivot_require_cuda_extension", "pivot_release_wheelhouse", "pivot_release_wheelhouse_lock",
                "pivot_release_python", "pivot_serving_extra_environment", "pivot_training_log_file",
                "pivot_training_checkpoint", "pivot_training_resume", "pivot_serving_min_free_disk_gib",
                "pivot_release_require_gpu", "pivot_quality_max_tokens"}
    prod_groups, lab_groups = production["all"]["children"], lab["all"]["children"]
    assert lab_groups.keys() == prod_groups.keys()
    for group, spec in prod_groups.items():
        assert lab_groups[group]["hosts"].keys() == spec["hosts"].keys()
        for host, prod_vars in spec["hosts"].items():
            lab_vars = lab_groups[group]["hosts"][host]
            same = {k: v for k, v in prod_vars.items() if k not in may_differ}
            assert {k: lab_vars.get(k) for k in same} == same, host
            assert set(lab_vars) - set(prod_vars) <= may_differ | lab_only, host
    assert os.path.realpath(labctl.REPO / "inventory/lab/group_vars") == str(
        labctl.REPO / "inventory/production/group_vars"
    )


def test_check_hosts_playbook_proves_every_host_and_writes_a_report() -> None:
    report = labctl.REPO / "artifacts" / "check-hosts.json"
    report.unlink(missing_ok=True)
    result = labctl.run(["ansible-playbook", str(labctl.REPO / "playbooks/check_hosts.yml")], timeout=300)
    assert result.rc == 0, result.stdout[-3000:] + result.stderr[-2000:]
    recap = {ln.split()[0]: ln for ln in result.stdout.splitlines() if " : ok=" in ln}
    assert set(recap) == {"ct200", "pro6000", "pve", "localhost"}
    for host in labctl.HOSTS:  # read-only on every managed host
        assert "failed=0" in recap[host] and "unreachable=0" in recap[host] and "changed=0" in recap[host]
    hosts = json.loads(report.read_text())
    assert hosts["ct200"]["connection"] == "community.proxmox.proxmox_pct_remote"
    assert {h["pid1"] for h in hosts.values()} == {"systemd"}
    assert {h["system_state"] for h in hosts.values()} == {"running"}
    assert len(hosts["ct200"]["gpus"]) == 8 and len(hosts["pro6000"]["gpus"]) == 2
    assert hosts["pro6000"]["sglang_unit"] == "active"
    assert hosts["pro6000"]["speculative_algorithm"] == "EAGLE"  # SGLang reports NEXTN as EAGLE


def test_check_hosts_names_a_missing_nvidia_smi_and_the_variable_that_points_at_it() -> None:
    """nvidia-smi not where the inventory says: each GPU host's row says so and names pivot_nvidia_smi_path, the
    variable that reaches every nvidia-smi Pivot runs (it used to print a raw rc 2 and write no report)."""
    report = labctl.REPO / "artifacts" / "check-hosts.json"
    report.unlink(missing_ok=True)
    result = labctl.run(["ansible-playbook", str(labctl.REPO / "playbooks/check_hosts.yml"),
                         "-e", "pivot_nvidia_smi_path=/opt/nowhere/nvidia-smi"], timeout=300)
    assert result.rc == 0, result.stdout[-3000:] + result.stderr[-2000:]
    hosts = json.loads(report.read_text())
    for host in ("ct200", "pro6000"):
        assert "gpus" not in hosts[host], hosts[host]
        assert hosts[host]["gpu_error"].startswith("/opt/nowhere/nvidia-smi was not found on this host"), hosts[host]
        assert "set pivot_nvidia_smi_path in the inventory" in hosts[host]["gpu_error"]
    markdown = (labctl.REPO / "artifacts" / "check-hosts.md").read_text()
    assert "**/opt/nowhere/nvidia-smi was not found on this host" in markdown


def test_check_hosts_reports_a_host_it_cannot_reach_instead_of_a_traceback() -> None:
    """ct200 behind its Proxmox node, as a container the node does not have: the run says the host was unreachable
    and still writes the report, with that host marked not reached (it used to end in a traceback, no report)."""
    report = labctl.REPO / "artifacts" / "check-hosts.json"
    report.unlink(missing_ok=True)
    result = labctl.run(["ansible-playbook", str(labctl.REPO / "playbooks/check_hosts.yml"),
                         "-e", "proxmox_vmid=999"], timeout=300)
    assert result.rc != 0, "an unreachable host is not a clean check"
    assert "HostVarsVars" not in result.stdout + result.stderr and "Traceback" not in result.stdout + result.stderr
    hosts = json.loads(report.read_text())
    assert hosts["ct200"] == {"reachable": False}, hosts["ct200"]
    assert hosts["pro6000"]["sglang_unit"] == "active" and len(hosts["pro6000"]["gpus"]) == 2
    assert "| ct200 | **not reached**" in (labctl.REPO / "artifacts" / "check-hosts.md").read_text()


def _serving_json(path: str) -> dict:
    result = labctl.ansible_adhoc("pro6000", "ansible.builtin.slurp", f"src={path}")
    assert not result.get("failed"), result
    return json.loads(base64.b64decode(result["content"]))


def test_the_serving_host_serves_a_pair_shaped_like_qwen36_and_its_z_lab_drafter() -> None:
    """Issue 14: the lab's serving host carries the user's model layout at the production paths (the hybrid target
    with its settings under text_config, the flat z-lab drafter), so preflight and the gates meet the real shapes."""
    target = _serving_json("/root/models/Qwen3.6-27B/config.json")
    drafter = _serving_json("/root/models/Qwen3.6-27B-DFlash/config.json")
    assert target["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "vision_config" in target
    text = target["text_config"]
    assert "num_hidden_layers" not in target and "linear_attention" in text["layer_types"]
    assert drafter["architectures"] == ["DFlashDraftModel"] and "text_config" not in drafter
    assert all(0 <= layer < text["num_hidden_layers"] - 1 for layer in drafter["dflash_config"]["target_layer_ids"])
    assert 0 <= drafter["dflash_config"]["mask_token_id"] < text["vocab_size"]
