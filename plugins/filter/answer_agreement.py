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
"""

EXAMPLES = r"""
- name: Gate on agreement with the baseline
  ansible.builtin.assert:
    that: (release_answers | pivot.ops.answer_agreement(baseline_answers)).mean >= 0.8
"""

RETURN = r"""
_value:
  description:
    - C(per_prompt) (one ratio per prompt, rounded to 3 places), C(mean), C(identical) (prompts answered alike).
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


def answer_agreement(answers, reference):
    if not isinstance(answers, list) or not isinstance(reference, list):
        raise AnsibleFilterError("answer_agreement: both the answers and the reference must be lists")
    if len(answers) != len(reference) or not reference:
        raise AnsibleFilterError("answer_agreement: got %d answers for %d reference answers (need the same, >= 1)"
                                 % (len(answers), len(reference)))
    ratios = [_agreement(str(a), str(r)) for a, r in zip(answers, reference, strict=True)]
    return {"per_prompt": [round(r, 3) for r in ratios], "mean": round(sum(ratios) / len(ratios), 3),
            "identical": sum(1 for a, r in zip(answers, reference, strict=True) if str(a) == str(r))}


class FilterModule:
    def filters(self):
        return {"answer_agreement": answer_agreement}
