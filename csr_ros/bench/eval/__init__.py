"""`csr-ros eval`: memory recall against decision latency, CSR against the usual alternatives.

    episode.py   observations and questions: a bag + questions JSONL, AMA-Bench JSONL / .json
    methods.py   csr (ASR eviction), window (last K tokens, or the latest chunks), bm25
                 (top-k chunks), none
    scoring.py   asking a question: options lettered and shuffled per question, scored by
                 label (default), pmi or mean; greedy answers; exact match, F1
    judge.py     the LLM judge's protocol (AMA-Bench's); judge_clients.py: where replies come from
    evidence.py  which observations make an answer true; whether a prompt held them
    patrol_questions.py  the synthetic patrol as an episode, questions from its ground truth
    run.py       replaying episodes into each method, one method after another
    report.py    rows per method, budget and scoring rule, the markdown table, the bias
                 check (most frequent answer, answers as no memory), the plot
    study.py     an evaluation as `csr-ros eval` runs it: inputs, budgets matched to CSR's,
                 the methods, the judge

Nothing here imports torch or rclpy; the local engine is reached through its resource.
"""
