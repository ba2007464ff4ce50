"""The OPD term's positive control at the smallest scale (issue 61): a student that samples its own tokens and is
trained by `opd_loss` (the loss `seed rl` trains with) toward a teacher that reads a skill the student lacks moves its
own distribution toward that teacher's, and one whose teacher reads another skill does not.

One state of a tiny random LM (weights scaled ×4 so that a prefix changes its next-token distribution), the teacher a
frozen copy reading the skill before the prompt, 32 of the student's samples a step, 40 Adam steps. Measured on this
machine: KL(π_student ‖ π_teacher(skill)) 2.48 → 0.17 (signed), 0.25 (gated NLL); with another skill's teacher 2.48 →
2.66. The margins below are a third of that and under half of it.
"""

from __future__ import annotations

import copy

import pytest
import torch

from seedcli.rl.losses import opd_loss
from tests.helpers_models import tiny_lm

pytest.importorskip("transformers")

PROMPT = [5, 17, 33, 8, 61, 2]
SKILL = [70, 71, 72, 73]
OTHER = [40, 41, 42, 43]


def _next_logp(model, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)


def _distil(teacher_skill: list[int], form: str, steps: int = 40, samples: int = 32) -> tuple[float, float]:
    """(KL before, KL after) of the student's next-token distribution on PROMPT against the teacher's with SKILL."""
    torch.manual_seed(0)
    student = tiny_lm(0)
    with torch.no_grad():
        for p in student.parameters():
            p.mul_(4.0)
    teacher = copy.deepcopy(student).eval()
    with torch.no_grad():
        target = _next_logp(teacher, SKILL + PROMPT)
        taught = _next_logp(teacher, teacher_skill + PROMPT)

    def kl() -> float:
        with torch.no_grad():
            lp = _next_logp(student, PROMPT)
        return float((lp.exp() * (lp - target)).sum())

    before = kl()
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    for _ in range(steps):
        logp = _next_logp(student, PROMPT)
        y = torch.multinomial(logp.detach().exp(), samples, replacement=True)  # the student's own samples
        loss, _ = opd_loss(logp[y][:, None], taught[y][:, None], torch.ones(samples, 1), form=form, clip=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, kl()


@pytest.mark.parametrize("form", ["signed", "gated_nll"])
def test_the_student_moves_toward_a_teacher_that_reads_the_skill(form):
    before, after = _distil(SKILL, form)
    assert before > 1.0  # the skill changes the teacher's distribution: there is something to absorb
    assert after < before / 3


def test_a_teacher_that_reads_another_skill_does_not_teach_this_one():
    before, after = _distil(OTHER, "signed")
    oracle_before, oracle_after = _distil(SKILL, "signed")
    assert after > before / 2  # the control: the student learned another distribution, not this skill's
    assert oracle_after < after / 4
