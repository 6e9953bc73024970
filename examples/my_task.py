"""A task written outside echo-swarm, trained as is:

    swarm-learner demo --task examples/my_task.py:make --steps 5

The learner imports this file, calls ``make(seed=..., **task.options)`` and uses the object it
returns: ``problem`` poses problems, ``render_prompt`` turns one into prompt token ids,
``reward`` scores a completion's text in [0, 1]. Nodes need nothing: prompts reach them as token
ids and the learner recomputes every reward. The interface is ``tasks/interface.py``.

The task: say which number comes after n. Numbers divisible by 4 are held out for evaluation,
the rest are for training, so the splits never share a question.
"""

import random

from tasks.base import Problem, render_prompt


class NextNumber:
    name = "next-number"
    version = "1"  # a multi-turn task's nodes must run the same version; harmless here

    def __init__(self, seed: int = 0, max_value: int = 200):
        self.seed, self.max_value = seed, max_value

    def problem(self, split: str, index: int) -> Problem:
        rng = random.Random(f"{self.seed}/{split}/{index}")
        while True:
            n = rng.randint(1, self.max_value)
            if (n % 4 == 0) == (split == "eval"):
                return Problem(id=f"next-{self.seed}-{split}-{index}", question=f"Which number comes after {n}?",
                               answer=n + 1)

    def messages(self, problem: Problem) -> list[dict]:
        return [{"role": "system", "content": "Answer with the number only."},
                {"role": "user", "content": "Which number comes after 7?"}, {"role": "assistant", "content": "8"},
                {"role": "user", "content": problem.question}]

    def render_prompt(self, tokenizer, problem: Problem) -> list[int]:
        return render_prompt(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        words = completion_text.strip().rstrip(".").split()
        return 1.0 if words and words[-1] == str(problem.answer) else 0.0


def make(seed: int = 0, **options) -> NextNumber:
    return NextNumber(seed, **options)
