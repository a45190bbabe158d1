"""`tempax serve` throughput and latency with 1, 4, 16 and 64 concurrent clients on SmolLM2-135M-Instruct, through the
`openai` client, with continuous batching and with static batches, in one run.

    python bench/serve.py                        # the table: every level, both schemes
    python bench/serve.py --clients 1,4 --max-tokens 32 --requests 8
    python bench/serve.py --record bench/records/serving.jsonl   # ... and the table onto docs/results.md

The server runs in this process on loopback (the real HTTP path: JSON in, server-sent events or JSON out). Each
client is a thread that sends chat requests one after another (greedy, `max_tokens` each, distinct questions of
similar length) until the run has sent `--requests` per level (at least two per client). Throughput is
completion tokens (the server's own `usage` counts) over the wall time from the first request to the last answer;
latency is each request's, median and 95th percentile.

Two servers with the same slots (`--max-batch`, 32) are measured in the same run: continuous batching as shipped
(a request joins the running decode at the next chunk) and static batches (`join_running=False`: requests that
arrive while a batch decodes wait for it to empty, the server's scheme before continuous batching). Every program
is compiled at start-up, so no level compiles; each level still sends one untimed round first. Prints a table
with the CPU and the 1-minute load average (the machine may be shared: a load above the core count makes every
figure pessimistic); `--json` prints one JSON object per row instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

QUESTIONS = ["Explain why the sky is blue to a child", "Describe how a bicycle gear works", "Tell a story about a"
             " lighthouse keeper", "Explain what a prime number is", "Describe the water cycle step by step",
             "Explain how bread rises", "Tell a story about a lost robot", "Describe how a compass works"]


def measure(client, clients: int, requests: int, max_tokens: int) -> dict:
    """Sends `requests` chat requests from `clients` threads; tokens/s, requests/s and latencies."""
    todo = list(range(max(requests, 2 * clients)))
    lock = threading.Lock()
    latencies, tokens = [], []

    def work():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            start = time.perf_counter()
            out = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})."}],
                temperature=0.0, max_tokens=max_tokens)
            with lock:
                latencies.append(time.perf_counter() - start)
                tokens.append(out.usage.completion_tokens)

    threads = [threading.Thread(target=work) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(latencies), "completion_tokens": sum(tokens), "wall_s": round(wall, 2),
            "tokens_per_s": round(sum(tokens) / wall, 1), "requests_per_s": round(len(latencies) / wall, 2),
            "latency_p50_s": round(statistics.median(latencies), 2),
            "latency_p95_s": round(statistics.quantiles(latencies, n=20, method="inclusive")[-1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--max-batch", type=int, default=32, help="slots of both servers")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least one per client)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", default=None, help="append the table to this records file (topic 'serving')")
    args = parser.parse_args()

    import openai

    from tempax.models.registry import load
    from tempax.serve import start_server

    model, tokenizer = load("smollm2-135m-instruct", progress=False)
    levels = [int(c) for c in args.clients.split(",")]
    rows = []
    for join_running in (True, False):
        server = start_server(model, tokenizer, port=0, model_name="smollm2", max_batch=args.max_batch,
                              max_model_len=256, join_running=join_running)
        server.start_in_thread()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused",
                               max_retries=0, timeout=3600)
        for clients in levels:
            measure(client, min(clients, 4), min(clients, 4), args.max_tokens)  # untimed round
            seen = len(server.batcher.live_rows)
            load_before = os.getloadavg()[0]
            row = measure(client, clients, args.requests, args.max_tokens)
            live = list(server.batcher.live_rows)[seen:]
            row.update(batching="continuous" if join_running else "static",
                       mean_live_rows=round(sum(live) / max(len(live), 1), 1),
                       load_1min=round(max(load_before, os.getloadavg()[0]), 2))
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
        server.shutdown()
        server.close()
    record = table_record(rows, args)
    if args.record:
        with open(args.record, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    if args.json:
        return
    print(f"{record['title']}; {record['cpu']}")
    print("| " + " | ".join(record["columns"]) + " |")
    print("|" + "---|" * len(record["columns"]))
    for row in record["rows"]:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def table_record(rows: list[dict], args: argparse.Namespace) -> dict:
    """The run as a table record of the results page's "serving" topic: per level and batching, throughput, its
    ratio to one client's, and the latencies, with the 1-minute load beside each."""
    from tempax.runtime.host import cpu_line

    one = {r["batching"]: r["tokens_per_s"] for r in rows if r["clients"] == 1}
    solo = {r["batching"]: r["latency_p50_s"] for r in rows if r["clients"] == 1}
    table = [[r["clients"], r["batching"], r["tokens_per_s"],
              f"{r['tokens_per_s'] / one[r['batching']]:.2f}x" if r["batching"] in one else "-",
              r["latency_p50_s"], r["latency_p95_s"],
              f"{r['latency_p95_s'] / solo[r['batching']]:.2f}x" if r["batching"] in solo else "-",
              r["mean_live_rows"], r["load_1min"]] for r in rows]
    return {"kind": "table", "topic": "serving",
            "title": f"`tempax serve` under concurrent clients: SmolLM2-135M-Instruct (float32), greedy, "
                     f"max_tokens={args.max_tokens}, {args.max_batch} slots, at least {args.requests} requests per "
                     "level, continuous batching against static batches in one run",
            "columns": ["clients", "batching", "tokens/s", "vs 1 client", "p50 latency (s)", "p95 latency (s)",
                        "p95 vs 1 client's p50", "mean live rows at a join", "1-min load"],
            "rows": table, "command": "python bench/serve.py", "cpu": cpu_line(),
            "notes": "A load above the core count makes a level's figures pessimistic; the bench's own threads "
                     "keep it near 1.5 on 2 cores."}


if __name__ == "__main__":
    main()
