"""Several answers for one image: the agreement rule that turns them into its class, "can't tell", or a dispute.

Every answer counts as a vote, "can't tell" (``CANT_TELL``, or a Label Studio annotation that was skipped)
included. ``majority``: the class (or "can't tell") that more than half of the image's answers give; ``unanimous``:
every answer gives the same one. An image with fewer answers than the number of annotators asked for waits for
more; an image whose answers do not meet the rule is a dispute, listed for people to review.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from units_lightning.annotation.answers import CANT_TELL, Answer

__all__ = ["AGREEMENT_RULES", "CANT_TELL", "Verdict", "agreed_label", "verdict"]

AGREEMENT_RULES = ("majority", "unanimous")


def agreed_label(labels: Sequence[str], rule: str = "majority") -> str | None:
    """The answer ``labels`` agree on under ``rule``, or None when they do not.

    Raises:
        ValueError: an unknown rule.

    Example:
        >>> agreed_label(["wren", "wren", "robin"]), agreed_label(["wren", "robin"])
        ('wren', None)
        >>> agreed_label(["wren", "wren", "robin"], "unanimous"), agreed_label(["wren", "wren"], "unanimous")
        (None, 'wren')
    """
    if rule not in AGREEMENT_RULES:
        raise ValueError(f"unknown agreement rule {rule!r}: one of {', '.join(AGREEMENT_RULES)}")
    if not labels:
        return None
    label, votes = Counter(labels).most_common(1)[0]
    needed = len(labels) if rule == "unanimous" else len(labels) // 2 + 1
    return label if votes >= needed else None


@dataclass(frozen=True)
class Verdict:
    """What an image's answers come to.

    Attributes:
        image: the image.
        label: the agreed class, ``CANT_TELL``, or None (waiting for answers, or disputed).
        answers: its answers, in the order they were read.
        waiting: it has fewer answers than the annotators asked for.
    """

    image: str
    label: str | None
    answers: tuple[Answer, ...]
    waiting: bool

    @property
    def disputed(self) -> bool:
        """Enough answers, but they do not meet the rule."""
        return self.label is None and not self.waiting


def verdict(image: str, answers: Sequence[Answer], rule: str = "majority", annotators: int = 1) -> Verdict:
    """The verdict on ``image`` from its ``answers`` under ``rule``, once at least ``annotators`` answered.

    Raises:
        ValueError: an unknown rule, or ``annotators`` < 1.
    """
    if annotators < 1:
        raise ValueError(f"annotators must be at least 1, got {annotators}")
    waiting = len(answers) < annotators
    label = None if waiting else agreed_label([a.label for a in answers], rule)
    return Verdict(image, label, tuple(answers), waiting)
