"""Reward functions on realistic completions, including malformed ones (no network)."""

import threading
from fractions import Fraction

import pytest

pytest.importorskip("math_verify")

from cegppo_trl.rewards import (  # noqa: E402
    REWARD_FUNCS,
    completion_text,
    extract_gsm8k_answer,
    extract_gsm8k_gold,
    format_reward,
    get_reward_func,
    last_boxed,
)

R1_CORRECT = (
    "Okay, so I need to find the probability. Let me think. There are 6 outcomes, 3 are even, so 3/6.\n"
    "Wait, let me double-check: 2, 4, 6 are even. Yes.\n</think>\n\n"
    "The probability of rolling an even number is $\\frac{3}{6} = \\frac{1}{2}$.\n\n"
    "**Final Answer**\n\\boxed{\\dfrac{1}{2}}"
)
R1_WRONG = R1_CORRECT.replace("\\boxed{\\dfrac{1}{2}}", "\\boxed{\\dfrac{1}{3}}")
R1_TRUNCATED = "Okay, let me compute. First, 3/6 = \\frac{1}{2}, so \\boxed{\\frac{1}"  # cut at max_completion_length
GSM8K_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def conversational(text):
    return [{"role": "assistant", "content": text}]


# ----------------------------------------------------------------------------------------------------------------
# math_verify
# ----------------------------------------------------------------------------------------------------------------
def test_math_verify_scores_authors_plus_minus_one_on_reasoning_trace():
    reward = REWARD_FUNCS["math_verify"]
    assert reward([R1_CORRECT, R1_WRONG], solution=["\\frac{1}{2}", "\\frac{1}{2}"]) == [1.0, -1.0]


def test_math_verify_01_variant_scores_one_and_zero():
    reward = REWARD_FUNCS["math_verify_01"]
    assert reward([R1_CORRECT, R1_WRONG], solution=["1/2", "1/2"]) == [1.0, 0.0]


def test_math_verify_accepts_equivalent_forms_of_the_reference():
    reward = REWARD_FUNCS["math_verify"]
    completions = ["so \\boxed{0.5}", "\\boxed{x^2 + 1}", "\\boxed{\\sqrt{2}/2}", "\\boxed{1,234}", "\\boxed{(1,2)}"]
    solutions = ["\\frac{1}{2}", "1+x^2", "\\frac{\\sqrt{2}}{2}", "1234", "(1, 2)"]
    assert reward(completions, solution=solutions) == [1.0] * 5


def test_math_verify_reads_a_reference_that_is_a_full_worked_solution():
    reward = REWARD_FUNCS["math_verify"]
    assert reward(["\\boxed{4}"], solution=["Since 2+2=4, the answer is $\\boxed{4}$."]) == [1.0]


def test_math_verify_uses_only_the_last_box():
    # math-verify alone would read both boxes as the set {3, 1/2} and mark this wrong.
    text = "Intermediate: \\boxed{3}. Hmm, that is the count, not the probability.\n</think>\n\\boxed{\\frac{1}{2}}"
    assert REWARD_FUNCS["math_verify"]([text], solution=["1/2"]) == [1.0]


def test_math_verify_handles_conversational_completions():
    reward = REWARD_FUNCS["math_verify"]
    assert reward([conversational(R1_CORRECT), conversational(R1_WRONG)], solution=["1/2", "1/2"]) == [1.0, -1.0]


@pytest.mark.parametrize(
    "completion",
    [
        pytest.param("The answer is 1/2.", id="no-box"),
        pytest.param(R1_TRUNCATED, id="truncated-inside-box"),
        pytest.param("", id="empty"),
        pytest.param("\\boxed{}", id="empty-box"),
        pytest.param("\\boxed{\\frac{}{}\\left(\\right.\\sqrt}", id="garbage-latex"),
        pytest.param("\\boxed{\\frac{1}{2}" * 3, id="unbalanced"),
        pytest.param(None, id="none"),
        pytest.param([], id="empty-message-list"),
    ],
)
def test_math_verify_gives_malformed_completions_the_negative_score(completion):
    assert REWARD_FUNCS["math_verify"]([completion], solution=["1/2"]) == [-1.0]
    assert REWARD_FUNCS["math_verify_01"]([completion], solution=["1/2"]) == [0.0]


@pytest.mark.parametrize("gold", [None, "", "   ", "\\frac{"], ids=["none", "empty", "blank", "unparseable"])
def test_math_verify_scores_a_missing_or_unparseable_reference_as_wrong(gold):
    # Every rollout of such a prompt gets the same score, so its group has zero advantage (no gradient).
    assert REWARD_FUNCS["math_verify"]([R1_CORRECT], solution=[gold]) == [-1.0]


@pytest.mark.parametrize("name", ["math_verify", "math_verify_01", "gsm8k", "gsm8k_01"])
def test_reference_reward_without_a_solution_column_raises_naming_the_column_and_the_fix(name):
    # Scoring every rollout "wrong" would train on nothing (reward -1, loss 0, no gradient) without a word.
    with pytest.raises(ValueError, match=rf"Reward `{name}` .* `solution` column, and the data has none \(its "
                       r"columns: answer\): `--solution_column COLUMN`.*rename_column"):  # fmt: skip
        get_reward_func(name)(["\\boxed{4}"], answer=["4"], prompts=["2+2?"], trainer_state=None)
    with pytest.raises(ValueError, match=r"columns: none\)"):
        REWARD_FUNCS[name]([R1_CORRECT])
    assert format_reward(["\\boxed{4}"], answer=["4"]) == [1.0]  # a reference-free reward needs none


def test_math_verify_runs_off_the_main_thread():
    # math-verify's signal.alarm timeouts raise ValueError outside the main thread; the reward disables them there.
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=REWARD_FUNCS["math_verify"]([R1_CORRECT], ["1/2"])))
    thread.start()
    thread.join()
    assert result["r"] == [1.0]


def test_math_verify_logs_parsed_answers_through_log_extra():
    logged = {}
    REWARD_FUNCS["math_verify"](
        [R1_CORRECT, "no box"], solution=["1/2", "1/2"], log_extra=lambda k, v: logged.setdefault(k, v)
    )
    assert list(logged) == ["math_verify_answer"]
    assert logged["math_verify_answer"][1] == "[no boxed answer]"


# ----------------------------------------------------------------------------------------------------------------
# GSM8K
# ----------------------------------------------------------------------------------------------------------------
def test_gsm8k_gold_is_the_number_after_the_hashes():
    assert extract_gsm8k_gold(GSM8K_GOLD) == 72
    assert extract_gsm8k_gold("... #### 1,234") == 1234
    assert extract_gsm8k_gold("#### -5") == -5
    assert extract_gsm8k_gold("#### 0.75") == Fraction(3, 4)
    assert extract_gsm8k_gold("18") == 18
    assert extract_gsm8k_gold(None) is None
    assert extract_gsm8k_gold("#### none") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 24 clips in May, so 48 + 24 = 72 clips in total.", 72),  # last number
        ("So she has $1,234.50 left.", Fraction(2469, 2)),  # thousands separator and decimals
        ("The temperature dropped to \u22123 degrees.", -3),  # unicode minus
        ("The change is -12.", -12),
        ("The answer is \\boxed{\\$18}. Check: 18 = 18, and 3 more.", 18),  # box wins over later numbers
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{42 \\text{ apples}}", 42),
        ("48 / 2 = 24\n#### 72\nI hope this helps! 1", 72),  # "####" wins over the last number
        ("It costs 1{,}000 dollars", 1000),
        ("<think>The count is 5. Hmm</think> The answer is 6.", 6),  # reasoning numbers ignored
        ("<think>The count is 5. Hmm, let me", None),  # never closed its reasoning
        ("I am not sure.", None),
        ("", None),
    ],
)
def test_gsm8k_extracts_the_final_number(text, expected):
    assert extract_gsm8k_answer(text) == expected


def test_gsm8k_reward_compares_numbers_exactly():
    completions = ["... so the total is 72.", "Answer: 72.00", "The answer is 71", conversational("\\boxed{72}"), ""]
    assert REWARD_FUNCS["gsm8k"](completions, solution=[GSM8K_GOLD] * 5) == [1.0, 1.0, -1.0, 1.0, -1.0]
    assert REWARD_FUNCS["gsm8k_01"](completions, solution=[GSM8K_GOLD] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]


def test_gsm8k_reward_scores_a_missing_reference_as_wrong():
    assert REWARD_FUNCS["gsm8k"](["72"], solution=[None]) == [-1.0]


# ----------------------------------------------------------------------------------------------------------------
# format and helpers
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>reasoning</think>\nSo \\boxed{4}", 1.0),
        ("reasoning (template opened <think>)\n</think>\n\\boxed{4}", 1.0),
        ("Plain answer \\boxed{x+1}", 1.0),
        ("<think>reasoning \\boxed{4} and then it was cut", 0.0),  # unclosed think
        ("<think>a</think><think>b</think>\\boxed{4}", 0.0),  # two think blocks
        ("</think>reasoning<think>\\boxed{4}", 0.0),  # tags out of order
        ("\\boxed{4}</think> trailing text", 0.0),  # the box is inside the reasoning only
        ("\\boxed{  }", 0.0),
        ("\\boxed{4", 0.0),
        ("The answer is 4", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward([text]) == [expected]
    assert format_reward([conversational(text)]) == [expected]


def test_completion_text_reads_every_completion_form():
    assert completion_text("plain") == "plain"
    assert completion_text(None) == ""
    assert completion_text([{"role": "assistant", "content": "a"}]) == "a"
    multi_turn = [
        {"role": "assistant", "content": "call tool"},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "final"},
    ]
    assert completion_text(multi_turn) == "final"
    parts = [{"type": "text", "text": "x"}, {"type": "image"}]
    assert completion_text([{"role": "assistant", "content": parts}]) == "x"


def test_last_boxed_balances_nested_braces():
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box") is None


def test_math_verify_is_a_core_dependency():
    # `reward_funcs` defaults to math_verify: a plain `pip install cegppo-trl` must be able to run it.
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)  # the core list only
    assert re.search(r'^\s*"math-verify>=', dependencies, re.M)


def test_trl_reward_functions_are_accepted_by_name():
    import trl.rewards

    for name in ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"):
        assert get_reward_func(name) is getattr(trl.rewards, name)
        assert get_reward_func(f"trl.rewards.{name}") is getattr(trl.rewards, name)
    assert get_reward_func("think_format_reward")([[{"content": "<think>a</think>b"}]]) == [1.0]


def test_unknown_reward_lists_the_built_ins_and_suggests_trl_names():
    with pytest.raises(ValueError) as error:
        get_reward_func("accuracy")
    message = str(error.value)
    assert "Unknown reward function 'accuracy' (did you mean 'accuracy_reward'?)" in message
    assert "Built-in: math_verify, math_verify_01, gsm8k, gsm8k_01, format" in message
    assert "TRL's: accuracy_reward, reasoning_accuracy_reward, think_format_reward" in message
    assert "`trl.rewards.<name>`" in message
    from cegppo_trl.scripts import CEGPPOScriptArguments

    with pytest.raises(ValueError, match=r"Unknown reward function 'accuracy' \(did you mean"):  # at parse time
        CEGPPOScriptArguments(dataset_name="x", reward_funcs=["accuracy"])
    assert CEGPPOScriptArguments(dataset_name="x", reward_funcs=["think_format_reward"]).reward_funcs


def test_registry_names_and_dotted_paths():
    for name, func in REWARD_FUNCS.items():
        assert get_reward_func(name) is func
    # TRL logs each reward as rewards/<__name__>/mean: the +1/-1 and 0/1 variants must not collide.
    names = [f.__name__ for f in REWARD_FUNCS.values()]
    assert names == ["math_verify", "math_verify_01", "gsm8k", "gsm8k_01", "format_reward"]
    assert get_reward_func("cegppo_trl.rewards.format_reward") is format_reward
    with pytest.raises(ValueError, match="Unknown reward function"):
        get_reward_func("accuracy")
    with pytest.raises(ValueError, match="Could not import"):
        get_reward_func("no_such_module.reward")
