"""The preflight rules: facts as the preflight role registers them in, named checks out.

The configs are shaped like the real ones: Qwen3.6-27B keeps its language model's settings under ``text_config``
(Qwen3_5ForConditionalGeneration), the z-lab drafter is a flat config with ``dflash_config``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.pivot.ops.plugins.filter.preflight_checks import preflight_checks

QWEN36_TEXT = {"model_type": "qwen3_5_text", "num_hidden_layers": 64, "hidden_size": 5120, "vocab_size": 248320,
               "full_attention_interval": 4}
QWEN36 = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": QWEN36_TEXT,
          "vision_config": {"depth": 27}}
ZLAB_DRAFTER = {"architectures": ["DFlashDraftModel"], "hidden_size": 5120, "vocab_size": 248320, "block_size": 16,
                "num_target_layers": 64, "dflash_config": {"target_layer_ids": [1, 16, 31, 46, 61],
                                                           "mask_token_id": 248077}}
UNIT = "sglang.service"


def slurp(value: Any) -> dict[str, Any]:
    return {"content": base64.b64encode(json.dumps(value).encode()).decode(), "encoding": "base64"}


def command(stdout: str = "", rc: int = 0, stderr: str = "") -> dict[str, Any]:
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "stdout_lines": stdout.splitlines()}


def process(pid: int, cmdline: str, mib: int = 40000, gpu: int = 0, visible: bool = True) -> dict[str, Any]:
    return {"pid": pid, "name": "python3", "used_memory_mib": mib, "gpu_index": gpu, "cmdline": cmdline,
            "visible": visible}


def serving_facts(**changes: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "target_model": "/root/models/Qwen3.6-27B", "target_config": slurp(QWEN36),
        "drafter_model": "/root/models/Qwen3.6-27B-DFlash", "drafter_config": slurp(ZLAB_DRAFTER),
        "draft_tokens": 16, "budget": 64, "topk": 8,
        "baseline_venv": "/root/ml-env", "baseline_sglang": command("0.5.11"),
        "release_python_path": "/usr/bin/python3.12", "release_python": command("3.12.3"),
        "gpus": {"gpus": [{"index": 0, "name": "NVIDIA RTX PRO 6000"}, {"index": 1, "name": "NVIDIA RTX PRO 6000"}],
                 "processes": [process(900, "/root/ml-env/bin/python3 -m sglang.launch_server ...")]},
        "holder_cgroups": {"900": "0::/system.slice/sglang.service\n"},
        "allowed_gpu_holders": [], "allow_variable": "pivot_serving_allowed_gpu_holders",
        "unit_name": UNIT, "unit": {"status": {"LoadState": "loaded", "ActiveState": "active", "DropInPaths": ""}},
        "cuda": {"nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_release": "Cuda compilation tools, release 13.0, V13.0.88",
                 "compute_capabilities": ["12.0"], "build_possible": True, "why_not": ""},
        "require_cuda": True, "disk": command("      Avail Mounted on\n 500000000000 /"), "min_free_gib": 20,
        "port": 30000, "listener": command(""), "listener_cgroup": {},
    }
    facts.update(changes)
    return facts


def by_name(checks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in checks}


def test_the_users_real_model_layout_passes_every_check() -> None:
    checks = by_name(preflight_checks(serving_facts(), "serving"))
    assert [c for c in checks.values() if not c["ok"]] == []
    assert "Qwen3_5ForConditionalGeneration, 64 layers, hidden 5120, vocab 248320 (text_config)" in \
        checks["target_config"]["detail"]
    assert "mask_token_id 248077 (target vocab 248320)" in checks["drafter_config"]["detail"]
    assert "SGLang 0.5.11 in /root/ml-env" in checks["baseline_sglang"]["detail"]


def test_a_flat_target_config_is_read_too() -> None:
    flat = {"architectures": ["Qwen3ForCausalLM"], **QWEN36_TEXT}
    checks = by_name(preflight_checks(serving_facts(target_config=slurp(flat)), "serving"))
    assert checks["target_config"]["ok"] and "(text_config)" not in checks["target_config"]["detail"]


@pytest.mark.parametrize("draft", [1, 17, "x"])
def test_draft_lengths_the_plugin_refuses_fail_with_its_words(draft: Any) -> None:
    check = by_name(preflight_checks(serving_facts(draft_tokens=draft), "serving"))["drafter_block_size"]
    assert not check["ok"]
    assert f"the DDTree plugin refuses draft length {draft}" in check["detail"]


def test_a_drafter_reading_the_targets_last_layer_is_refused() -> None:
    drafter = {**ZLAB_DRAFTER, "dflash_config": {"target_layer_ids": [1, 63], "mask_token_id": 248077}}
    check = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))["drafter_target_layers"]
    assert not check["ok"] and "not [63]" in check["detail"]


def test_a_drafter_of_another_target_is_refused() -> None:
    drafter = {**ZLAB_DRAFTER, "num_target_layers": 48}
    check = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))["drafter_target_layers"]
    assert not check["ok"] and "trained on a 48-layer target" in check["detail"]


SLIDING_DRAFTER = {**ZLAB_DRAFTER, "model_type": "qwen3", "num_hidden_layers": 5, "sliding_window": 2048,
                   "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "use_sliding_window": True}


def test_a_drafter_with_sliding_window_layers_passes_when_transformers_keeps_the_window() -> None:
    assert by_name(preflight_checks(serving_facts(drafter_config=slurp(SLIDING_DRAFTER)), "serving"))[
        "drafter_config"]["ok"]


@pytest.mark.parametrize(("change", "named"), [
    ({"use_sliding_window": None}, "use_sliding_window: true"),
    ({"use_sliding_window": False}, "use_sliding_window: true"),
    ({"sliding_window": None}, "sliding_window is None"),
])
def test_a_drafter_whose_window_sglang_would_not_see_is_refused(change: dict[str, Any], named: str) -> None:
    drafter = {key: value for key, value in {**SLIDING_DRAFTER, **change}.items() if value is not None}
    check = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))["drafter_config"]
    assert not check["ok"] and named in check["detail"] and "sliding_attention" in check["detail"]


def test_a_mask_token_outside_the_vocabulary_is_refused() -> None:
    drafter = {**ZLAB_DRAFTER, "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 248320}}
    checks = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))
    assert not checks["drafter_config"]["ok"]


def test_a_drafter_block_shorter_than_the_draft_length_is_refused() -> None:
    drafter = {**ZLAB_DRAFTER, "block_size": 8}
    checks = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))
    assert not checks["drafter_block_size"]["ok"]
    assert checks["drafter_block_size"]["detail"] == "draft length 16 needs drafter block_size >= it; drafter has 8"
    # the same drafter serves a draft length it was trained for
    assert by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter), draft_tokens=8), "serving"))[
        "drafter_block_size"]["ok"]


@pytest.mark.parametrize(("key", "drafter_value", "target_value"), [
    ("vocab_size", 151936, 248320), ("hidden_size", 4096, 5120)])
def test_a_drafter_of_another_vocabulary_or_width_is_refused_against_the_nested_target(
        key: str, drafter_value: int, target_value: int) -> None:
    drafter = {**ZLAB_DRAFTER, key: drafter_value}
    checks = by_name(preflight_checks(serving_facts(drafter_config=slurp(drafter)), "serving"))
    # the target's value is read from text_config, where Qwen3.6-27B keeps it
    assert not checks[key]["ok"]
    assert checks[key]["detail"] == f"target {target_value}, drafter {drafter_value}"
    others = [name for name, c in checks.items() if not c["ok"]]
    assert others == [key]


def test_an_unreadable_or_garbled_config_fails_its_check_not_the_phase() -> None:
    garbled = {"content": base64.b64encode(b"{not json: 'x'}\n<|>").decode()}
    checks = by_name(preflight_checks(serving_facts(target_config=garbled,
                                                    drafter_config={"msg": "file not found"}), "serving"))
    assert not checks["target_config"]["ok"] and "not JSON" in checks["target_config"]["detail"]
    assert not checks["drafter_config"]["ok"] and "file not found" in checks["drafter_config"]["detail"]
    assert not checks["vocab_size"]["ok"]


def test_a_stray_gpu_holder_on_the_serving_host_is_named_and_refused() -> None:
    stray = process(4242, "python3 /home/bob/notebook_kernel.py", mib=30000, gpu=1)
    gpus = {**serving_facts()["gpus"], "processes": serving_facts()["gpus"]["processes"] + [stray]}
    check = by_name(preflight_checks(serving_facts(gpus=gpus), "serving"))["gpu_holders"]
    assert not check["ok"]
    assert "PID 4242 (python3 /home/bob/notebook_kernel.py) holds 30000 MiB on GPU 1" in check["detail"]
    assert "pivot_serving_allowed_gpu_holders" in check["detail"]
    allowed = by_name(preflight_checks(serving_facts(gpus=gpus, allowed_gpu_holders=["notebook_kernel"]), "serving"))
    assert allowed["gpu_holders"]["ok"]


def test_holders_not_visible_here_are_reported_not_refused() -> None:
    hidden = process(77, "", visible=False)
    gpus = {**serving_facts()["gpus"], "processes": [hidden]}
    check = by_name(preflight_checks(serving_facts(gpus=gpus), "serving"))["gpu_holders"]
    assert check["ok"] and "not visible" in check["detail"]


def test_a_drop_in_on_the_unit_is_refused_with_its_path() -> None:
    unit = {"status": {"LoadState": "loaded", "ActiveState": "active",
                       "DropInPaths": "/etc/systemd/system/sglang.service.d/override.conf"}}
    check = by_name(preflight_checks(serving_facts(unit=unit), "serving"))["unit_drop_ins"]
    assert not check["ok"] and "/etc/systemd/system/sglang.service.d/override.conf" in check["detail"]


def test_a_baseline_venv_without_sglang_is_refused() -> None:
    broken = command(rc=1, stderr="Traceback ...\nModuleNotFoundError: No module named 'sglang'")
    check = by_name(preflight_checks(serving_facts(baseline_sglang=broken), "serving"))["baseline_sglang"]
    assert not check["ok"] and "No module named 'sglang'" in check["detail"]


def test_a_missing_release_interpreter_is_refused() -> None:
    missing = {"rc": 2, "msg": "Error executing command.", "stderr": "", "cmd": ["/usr/bin/python3.12", "-c", "x"]}
    check = by_name(preflight_checks(serving_facts(release_python=missing), "serving"))["release_python"]
    assert not check["ok"] and "pivot_release_python" in check["detail"]
    assert "cannot run /usr/bin/python3.12: Error executing command." in check["detail"]


def test_a_port_held_by_another_program_is_refused() -> None:
    listener = command('LISTEN 0 128 0.0.0.0:30000 0.0.0.0:* users:(("nginx",pid=77,fd=6))')
    checks = by_name(preflight_checks(serving_facts(listener=listener, listener_cgroup=slurp("x")), "serving"))
    assert not checks["port"]["ok"] and "nginx" in checks["port"]["detail"]


def test_too_little_disk_is_refused() -> None:
    small = command("      Avail Mounted on\n 1073741824 /")
    check = by_name(preflight_checks(serving_facts(disk=small), "serving"))["free_disk"]
    assert not check["ok"] and "1.0 GiB free; need 20 GiB" in check["detail"]


def test_skipped_checks_pass_and_say_so() -> None:
    unit = {"status": {"LoadState": "loaded", "DropInPaths": "/etc/x.conf"}}
    check = by_name(preflight_checks(serving_facts(unit=unit), "serving", ["unit_drop_ins"]))["unit_drop_ins"]
    assert check["ok"] and check["skipped"]


def training_facts(**changes: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "job": {"pids": [{"pid": 10, "cmdline": "bash /root/run.sh"},
                         {"pid": 11, "cmdline": "python3 -u /root/train_dflash_pipeline.py"}]},
        "checkpoint_dir": "/data/dflash/checkpoints",
        "checkpoint_stat": {"stat": {"exists": True, "isdir": True, "writeable": True}},
        "gpus": {"gpus": [{"index": i, "name": "NVIDIA H200"} for i in range(8)],
                 "processes": [process(11, "python3 -u /root/train_dflash_pipeline.py")]},
        "allowed_gpu_holders": [], "allow_variable": "pivot_training_allowed_gpu_holders",
    }
    facts.update(changes)
    return facts


def test_the_training_side_passes_when_only_the_job_holds_gpus() -> None:
    checks = by_name(preflight_checks(training_facts(), "training"))
    assert all(c["ok"] for c in checks.values()), checks


def test_a_gpu_holder_outside_the_job_is_refused_on_the_training_host() -> None:
    holders = [process(11, "python3 -u /root/train_dflash_pipeline.py"), process(99, "python3 eval_old_ckpt.py", gpu=3)]
    gpus = {**training_facts()["gpus"], "processes": holders}
    check = by_name(preflight_checks(training_facts(gpus=gpus), "training"))["gpu_holders"]
    assert not check["ok"] and "PID 99 (python3 eval_old_ckpt.py)" in check["detail"]


def test_no_job_found_while_the_training_gpus_are_busy_is_a_selector_that_misses_the_job() -> None:
    # the user's real trainer, selected by an argv element it does not have: nothing matches, the GPUs stay busy
    facts = training_facts(job={"pids": [], "changed": False},
                           job_selector={"cmdline_match": ["train_dflash_pipeline"]},
                           gpus={"gpus": [{"index": 0}], "processes": [
                               process(4242, "python3 -u /root/train_dflash_pipeline.py"),
                               process(4300, "", mib=30000, gpu=1, visible=False)]})
    check = by_name(preflight_checks(facts, "training"))["training_job"]
    assert not check["ok"]
    assert 'no process matches the job selector {"cmdline_match": ["train_dflash_pipeline"]}' in check["detail"]
    assert "PID 4242 (python3 -u /root/train_dflash_pipeline.py) holds 40000 MiB on GPU 0" in check["detail"]
    assert "PID 4300 (not visible in this host's /proc) holds 30000 MiB" in check["detail"]
    assert "the selector misses it" in check["detail"]


def test_no_job_and_free_or_allowed_gpus_is_a_job_already_gone() -> None:
    free = training_facts(job={"pids": []}, gpus={"gpus": [{"index": 0}], "processes": []})
    assert by_name(preflight_checks(free, "training"))["training_job"]["ok"]
    allowed = training_facts(job={"pids": []}, allowed_gpu_holders=["dcgm-exporter"],
                             gpus={"gpus": [{"index": 0}], "processes": [process(77, "/usr/bin/dcgm-exporter")]})
    check = by_name(preflight_checks(allowed, "training"))["training_job"]
    assert check["ok"] and "already gone" in check["detail"]


def test_a_job_none_of_whose_processes_handles_the_checkpoint_signal_is_refused_before_the_stop() -> None:
    # what pivot.ops.stop_training reports in check mode for a trainer without a SIGUSR1 handler
    job = {**training_facts()["job"], "checkpoint_signal_targets": []}
    check = by_name(preflight_checks(training_facts(job=job, checkpoint_signal="SIGUSR1"), "training"))["training_job"]
    assert not check["ok"]
    assert "none of its processes handles SIGUSR1" in check["detail"]
    assert "pivot_training_checkpoint.request=file" in check["detail"]
    assert "pivot_training_force=true" in check["detail"]


@pytest.mark.parametrize("force", [True, "True"])
def test_a_forced_stop_without_a_handler_passes_and_says_there_will_be_no_checkpoint(force: Any) -> None:
    job = {**training_facts()["job"], "checkpoint_signal_targets": []}
    check = by_name(preflight_checks(training_facts(job=job, force=force), "training"))["training_job"]
    assert check["ok"] and "WITHOUT a checkpoint" in check["detail"]


def test_a_job_with_signal_handlers_or_another_request_passes() -> None:
    for targets in ([11], None):
        job = {**training_facts()["job"], "checkpoint_signal_targets": targets}
        check = by_name(preflight_checks(training_facts(job=job), "training"))["training_job"]
        assert check["ok"] and check["detail"].startswith("found the job: 2 processes")


def test_a_missing_checkpoint_directory_is_refused() -> None:
    checks = by_name(preflight_checks(training_facts(checkpoint_stat={"stat": {"exists": False}}), "training"))
    assert not checks["checkpoint_dir"]["ok"] and "does not exist" in checks["checkpoint_dir"]["detail"]


def space(free_gib: float, newest_gib: float | None) -> dict[str, Any]:
    newest = None if newest_gib is None else "/data/dflash/checkpoints/step_5400"
    return {**training_facts()["job"], "checkpoint_space": {
        "directory": "/data/dflash/checkpoints", "free_bytes": int(free_gib * 1024**3), "newest": newest,
        "newest_bytes": None if newest_gib is None else int(newest_gib * 1024**3)}}


def test_a_checkpoint_disk_without_room_for_one_more_checkpoint_is_refused() -> None:
    check = by_name(preflight_checks(training_facts(job=space(3.0, 16.0)), "training"))["checkpoint_space"]
    assert not check["ok"]
    assert check["detail"].startswith("/data/dflash/checkpoints: 3.0 GiB free, the newest checkpoint "
                                      "(/data/dflash/checkpoints/step_5400) takes 16.0 GiB: the checkpoint the stop "
                                      "asks for would not fit"), check["detail"]
    assert "ENOSPC" in check["detail"] and "Free space there" in check["detail"]


def test_room_for_one_more_checkpoint_or_none_to_size_it_by_passes() -> None:
    assert by_name(preflight_checks(training_facts(job=space(40.0, 16.0)), "training"))["checkpoint_space"]["ok"]
    first = by_name(preflight_checks(training_facts(job=space(1.0, None)), "training"))["checkpoint_space"]
    assert first["ok"] and "no complete checkpoint yet" in first["detail"]
    assert by_name(preflight_checks(training_facts(), "training"))["checkpoint_space"]["ok"]


def test_the_filter_refuses_an_unknown_side() -> None:
    with pytest.raises(AnsibleFilterError, match="side must be"):
        preflight_checks({}, "gateway")


def test_a_failed_gpu_query_fails_gpu_count_once() -> None:
    failed = {"failed": True, "msg": "Expected 4 GPU(s) but nvidia-smi lists 2"}
    checks = by_name(preflight_checks(serving_facts(gpus=failed), "serving"))
    assert not checks["gpu_count"]["ok"] and "Expected 4 GPU(s)" in checks["gpu_count"]["detail"]
    assert checks["gpu_holders"]["ok"] and "not checked" in checks["gpu_holders"]["detail"]


def test_no_nvcc_fails_only_where_the_extension_is_required() -> None:
    cuda = {"nvcc": None, "compute_capabilities": ["12.0"], "build_possible": False,
            "why_not": "no nvcc found (looked on PATH, /usr/local/cuda/bin)"}
    required = by_name(preflight_checks(serving_facts(cuda=cuda), "serving"))["cuda_toolchain"]
    assert not required["ok"] and "no nvcc found" in required["detail"]
    optional = by_name(preflight_checks(serving_facts(cuda=cuda, require_cuda=False), "serving"))["cuda_toolchain"]
    assert optional["ok"] and "its PyTorch path will be used" in optional["detail"]
