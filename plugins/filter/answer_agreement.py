# -*- coding: utf-8 -*-
# Copyright: Pivot developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: answer_agreement
short_description: How far a release's greedy answers agree with the baseline's
version_added: 0.1.0
author: Pivot developers (@pivot)
description:
  - Compares two lists of greedy answers to the same prompts, position by position. A prompt's agreement is the length
    of the answers' common prefix divided by the length of the baseline's answer (1.0 when both are empty, 0.0 when only
    the baseline's is), so an answer that leaves the baseline's path early scores low however similar its end is.
  - The mean over the prompts is what the release's quality gate compares with its threshold. Speculative decoding is
    lossless in exact arithmetic; in bf16 a release's answer may leave the baseline's after some tokens, which costs
    part of one prompt's score, while wrong output from a broken release scores near 0 on every prompt.
options:
  _input:
    description: The release's answers.
    type: list
    elements: str
    required: true
  reference:
    description: The baseline's answers to the same prompts, in the same order.
    type: list
    elements: str
    required: true
  skip_unanswered:
    description:
      - Leave out the prompts whose reference answer is empty (their C(per_prompt) is null) instead of scoring them.
        The quality gate compares the answers after a reasoning model's think block (what SGLang's
        C(--reasoning-parser) splits off); a reference whose thinking did not end within the token limit has no answer
        to compare with.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Gate on agreement with the baseline
  ansible.builtin.assert:
    that: (release_answers | pivot.ops.answer_agreement(baseline_answers)).mean >= 0.8
"""

RETURN = r"""
_value:
  description:
    - C(per_prompt) (one ratio per prompt, rounded to 3 places; null for a prompt left out), C(mean) (over the judged
      prompts; null when none was), C(identical) (prompts answered alike), C(judged) (prompts scored).
  type: dict
"""

from ansible.errors import AnsibleFilterError


def _common_prefix(left, right):
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


def _agreement(answer, reference):
    if not reference:
        return 1.0 if not answer else 0.0
    return _common_prefix(answer, reference) / len(reference)


def answer_agreement(answers, reference, skip_unanswered=False):
    if not isinstance(answers, list) or not isinstance(reference, list):
        raise AnsibleFilterError("answer_agreement: both the answers and the reference must be lists")
    if len(answers) != len(reference) or not reference:
        raise AnsibleFilterError("answer_agreement: got %d answers for %d reference answers (need the same, >= 1)"
                                 % (len(answers), len(reference)))
    pairs = [(str(a if a is not None else ""), str(r if r is not None else ""))
             for a, r in zip(answers, reference, strict=True)]
    ratios = [None if skip_unanswered and not r else _agreement(a, r) for a, r in pairs]
    judged = [ratio for ratio in ratios if ratio is not None]
    return {"per_prompt": [None if r is None else round(r, 3) for r in ratios],
            "mean": round(sum(judged) / len(judged), 3) if judged else None,
            "identical": sum(1 for (a, r), ratio in zip(pairs, ratios, strict=True) if ratio is not None and a == r),
            "judged": len(judged)}


class FilterModule:
    def filters(self):
        return {"answer_agreement": answer_agreement}
