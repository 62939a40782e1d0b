"""The Python API (`postrl.api`): the command line's twin. Configs resolve key for key as the command resolves
them, errors are the command's messages raised as UserError, rows in memory and Python reward functions work
(TRL's quickstart reward unchanged), config.yaml names them, a resume without them says what to pass, and
``on_iteration`` stops a run early. ``import postrl`` imports no torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import postrl
from postrl import api
from postrl.cli import main
from postrl.lm.grpo import GRPOConfig
from postrl.lm.models import TinyLMConfig, build_tiny_lm
from postrl.lm.stages import STAGES
from postrl.lm.tasks import build_corpus
from postrl.lm.tokenizer import build_tokenizer
from postrl.runtime.config import load_config, to_dict


def reward_len(completions, **kwargs):
    """TRL's quickstart reward function, unchanged (https://huggingface.co/docs/trl/quickstart)."""
    return [-abs(20 - len(completion)) for completion in completions]


SEEN: list = []


def record_kwargs(completions, **kwargs):
    SEEN.append((completions, kwargs))
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny Llama (d = 32, 2 layers, 128 positions) and its tokenizer, saved as a user's model folder."""
    path = tmp_path_factory.mktemp("model")
    tokenizer = build_tokenizer(build_corpus(n_lines=500, seed=0), vocab_size=300)
    config = TinyLMConfig(
        n_layers=2, hidden_size=32, n_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    ids = {k: getattr(tokenizer, f"{k}_token_id") for k in ("pad", "eos", "bos")}
    build_tiny_lm(
        len(tokenizer), config, seed=0, **{f"{k}_token_id": v for k, v in ids.items()}
    ).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


TINY_GRPO = {
    "max_prompt_length": 32,
    "sampling": {"max_new_tokens": 8},
    "grpo": {"prompts_per_step": 2, "group_size": 4},
    "eval_size": 2,
    "run.eval_every": 0,
    "run.log_every": 1,
}
PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def test_import_postrl_imports_no_torch() -> None:
    code = (
        "import sys, postrl, postrl.control; f = postrl.grpo; postrl.Result; postrl.UserError; "
        "print(sorted(postrl.api.stages())); print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    stages, imported = out.strip().splitlines()
    assert imported == "False False"
    assert eval(stages) == sorted(name.replace("-", "_") for name in STAGES)


def test_every_stage_of_the_command_is_a_function() -> None:
    for name in STAGES:  # a stage registered for the command is postrl.<name> with no more code
        fn = getattr(postrl, name.replace("-", "_"))
        assert callable(fn) and name.replace("-", "_") in dir(postrl)
        assert f"postrl {name}" in fn.__doc__
    with pytest.raises(AttributeError):
        postrl.no_such_stage  # noqa: B018


@pytest.mark.parametrize(
    "config", ["grpo-arithmetic", GRPOConfig(data="task:arithmetic"), {"data": "task:arithmetic"}, None]
)
def test_config_and_overrides_resolve_as_the_command_line(config, tmp_path) -> None:
    overrides = {"optim": {"lr": 1e-5}, "grpo.group_size": 4, "run": {"steps": 3}, "model": tmp_path / "m"}
    got = api.resolve_config("grpo", config, overrides, tmp_path, resume=False)
    cli = ["optim.lr=1e-5", "grpo.group_size=4", "run.steps=3", f"model={tmp_path / 'm'}"]
    if isinstance(config, str) or config is None:
        expected = load_config(GRPOConfig, config, cli)
    else:
        expected = load_config(
            GRPOConfig, None, cli, base=to_dict(config) if not isinstance(config, dict) else config
        )
    assert to_dict(got) == to_dict(expected)
    assert got.optim.lr == 1e-5 and got.grpo.group_size == 4 and got.model == str(tmp_path / "m")


@pytest.mark.parametrize(
    ("kwargs", "argv"),
    [
        ({"optim": {"lrr": 1}}, ["optim.lrr=1"]),
        ({"run.steps": 0}, ["run.steps=0"]),
        ({"grpo": {"clip_eps": float("nan")}}, ["grpo.clip_eps=.nan"]),
        ({"model": "/no/such/model"}, ["--model", "/no/such/model"]),
        (
            {"data": "/no/such.jsonl", "rewards": ["task:arithmetic"]},
            ["data=/no/such.jsonl", "rewards=[task:arithmetic]"],
        ),
        ({"rewards": ["no_such_module:fn"]}, ["rewards=[no_such_module:fn]"]),
    ],
)
def test_errors_are_the_commands(kwargs, argv, tiny_model, tmp_path, capsys) -> None:
    base = {"model": str(tiny_model), **{k: v for k, v in TINY_GRPO.items() if "." not in k}}
    cli_base = [
        "--model",
        str(tiny_model),
        "max_prompt_length=32",
        "sampling.max_new_tokens=8",
        "eval_size=2",
    ]
    cli_base += ["grpo.prompts_per_step=2", "grpo.group_size=4"]
    with pytest.raises(postrl.UserError) as err:
        postrl.grpo("grpo-arithmetic", out=tmp_path / "api", **{**base, **kwargs})
    assert (
        main(["grpo", "--config", "grpo-arithmetic", "--out", str(tmp_path / "cli"), *cli_base, *argv]) == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"postrl: error: {err.value}"
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()


def test_out_is_required_and_unknown_stages_are_named() -> None:
    with pytest.raises(postrl.UserError, match=r"postrl.sft: out= is required"):
        postrl.sft("sft-arithmetic")
    with pytest.raises(postrl.UserError, match="unknown stage 'spt'; the stages: pretrain, sft"):
        api.run_stage("spt", out="x")


def test_grpo_with_trls_quickstart_reward_rows_in_memory_and_resume(tiny_model, tmp_path) -> None:
    out = tmp_path / "grpo"
    SEEN.clear()
    result = postrl.grpo(
        model=tiny_model,
        data=PROMPTS,
        rewards=[reward_len, record_kwargs],
        out=out,
        run={"steps": 2},
        **TINY_GRPO,
    )
    assert isinstance(result, postrl.Result) and result.run_dir == out
    assert result.summary["steps"] == 2 and result.summary == json.loads((out / "summary.json").read_text())
    assert (result.model_path / "config.json").is_file() and (out / "curves.png").is_file()
    # the keyword call of TRL: strings for standard prompts, the data's other columns by name
    completions, kwargs = SEEN[0]
    assert isinstance(completions[0], str) and {"prompts", "completion_ids", "answer"} <= set(kwargs)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r for r in rows if "reward_mean" in r]
    assert rewards and all(r["reward_mean"] <= 0 for r in rewards)  # −|20 − len| from reward_len
    text = (out / "config.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["rewards"] == ["callable:tests.test_api.reward_len", "callable:tests.test_api.record_kwargs"]
    assert cfg["data"].startswith("memory:")
    assert text.startswith("# postrl: rows (data: memory:...) were given in memory")
    assert "pass rewards= again to resume" in text.splitlines()[1]

    with pytest.raises(postrl.UserError, match="pass the same data= again"):
        postrl.grpo(out=out, resume=True, run={"steps": 3})
    with pytest.raises(
        postrl.UserError, match="'callable:tests.test_api.reward_len': a Python function given"
    ):
        postrl.grpo(out=out, resume=True, data=PROMPTS, run={"steps": 3})
    resumed = postrl.grpo(
        out=out, resume=True, data=PROMPTS, rewards=[reward_len, record_kwargs], run={"steps": 3}
    )
    assert resumed.summary["steps"] == 3


def test_the_in_memory_note_is_written_when_the_run_fits_a_value(tiny_model, tmp_path) -> None:
    """A run that writes a value it fitted (max_prompt_length clipped to the context left by the new tokens)
    has a config.yaml that differs from the config it was given; the note must still be written."""
    settings = {k: v for k, v in TINY_GRPO.items() if k != "max_prompt_length"}
    out = tmp_path / "grpo"
    postrl.grpo(model=tiny_model, data=PROMPTS, rewards=[reward_len], out=out, run={"steps": 1}, **settings)
    text = (out / "config.yaml").read_text()
    assert yaml.safe_load(text)["max_prompt_length"] < 512  # fitted: the default does not fit
    assert text.startswith("# postrl: rows (data: memory:...) were given in memory")


def test_on_iteration_stops_early_and_sft_takes_a_dataset(tiny_model, tmp_path) -> None:
    datasets = pytest.importorskip("datasets")
    system = {"role": "system", "content": "Answer with the number."}
    rows = [
        {
            "messages": [
                system,
                {"role": "user", "content": f"{a}+{a}="},
                {"role": "assistant", "content": str(2 * a)},
            ]
        }
        for a in range(20)
    ]
    seen = []

    def on_iteration(info) -> bool:
        seen.append((info["step"], sorted(info["metrics"])))
        return info["step"] < 2  # False at step 2: stop there (SB3's convention)

    result = postrl.sft(
        model=tiny_model,
        data=datasets.Dataset.from_list(rows),
        out=tmp_path / "sft",
        on_iteration=on_iteration,
        train={"batch_size": 4, "max_length": 64},
        run={"steps": 10, "eval_every": 0, "log_every": 1},
    )
    assert [s for s, _ in seen] == [1, 2] and "loss" in seen[0][1]
    assert result.summary["steps"] == 2 and (tmp_path / "sft" / "curves.png").is_file()
    assert (result.model_path / "model.safetensors").is_file()


def test_the_registry_is_what_the_command_and_the_api_read() -> None:
    """One table: each stage's command parses its flags, its config class is the API's, its help is the
    command's, and its data kind names rows `postrl.lm.data.load_rows` reads; no torch on import."""
    from postrl.cli import build_parser
    from postrl.lm.data.checks import TEXT_FIELDS
    from postrl.lm.stages import get_stage

    parser = build_parser()
    for stage in STAGES.values():
        args = parser.parse_args(
            [stage.name, *(x for flag in stage.flags for x in (flag, "v")), "--out", "o"]
        )
        assert all(getattr(args, flag.lstrip("-").replace("-", "_")) == "v" for flag in stage.flags)
        assert dataclasses.is_dataclass(stage.config_class()) and callable(stage.run_function())
        assert stage.data_kind is None or stage.data_kind in TEXT_FIELDS
        assert get_stage(stage.python_name) is get_stage(stage.name) is stage
    with pytest.raises(postrl.UserError, match="unknown stage 'no_such'; the stages: pretrain, sft"):
        get_stage("no_such")
    rows = get_stage("kto").load_data("task:reviews")  # preference pairs unpaired for KTO, as TRL does
    assert {r["label"] for r in rows} == {True, False} and {"prompt", "completion"} <= set(rows[0])
