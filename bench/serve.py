"""`tempax serve` throughput with 1, 4 and 16 concurrent clients on SmolLM2-135M-Instruct, through the `openai` client.

    python bench/serve.py                        # the table of docs/serving.md
    python bench/serve.py --clients 1,4 --max-tokens 32 --requests 8

The server runs in this process on loopback (the real HTTP path: JSON in, server-sent events or JSON out). Each
client is a thread that sends chat requests one after another (greedy, `max_tokens` each, distinct questions of
similar length) until the run has sent `--requests` per level (at least one per client). Throughput is
completion tokens (the server's own `usage` counts) over the wall time from the first request to the last answer.

Two servers are measured in the same run: the batcher as shipped (`--max-batch 32`) and the same server with
`max_batch=1`, where requests run one at a time: their ratio is what sharing decode steps gives. Each level is
run once untimed first, so that every batch shape it meets is compiled before the timed run. Prints a table
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


def cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def measure(client, clients: int, requests: int, max_tokens: int) -> dict:
    """Sends `requests` chat requests from `clients` threads; tokens/s, requests/s and latencies."""
    todo = list(range(max(requests, clients)))
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
            "latency_median_s": round(statistics.median(latencies), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=16, help="requests per level (at least one per client)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import openai

    from tempax.models.registry import load
    from tempax.serve import start_server

    model, tokenizer = load("smollm2-135m-instruct", progress=False)
    levels = [int(c) for c in args.clients.split(",")]
    rows = []
    for max_batch in (32, 1):
        server = start_server(model, tokenizer, port=0, model_name="smollm2", max_batch=max_batch)
        server.start_in_thread()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused",
                               max_retries=0, timeout=3600)
        for clients in levels:
            measure(client, clients, args.requests, args.max_tokens)  # compiles every batch shape this level meets
            seen = len(server.batcher.batch_rows)
            load_before = os.getloadavg()[0]
            row = measure(client, clients, args.requests, args.max_tokens)
            batches = list(server.batcher.batch_rows)[seen:]
            row.update(max_batch=max_batch, mean_batch_rows=round(sum(batches) / len(batches), 1),
                       load_1min=round(max(load_before, os.getloadavg()[0]), 2))
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
        server.shutdown()
        server.close()
    if args.json:
        return
    alone = {r["clients"]: r["tokens_per_s"] for r in rows if r["max_batch"] == 1}
    print(f"tempax serve, SmolLM2-135M-Instruct (float32), greedy, max_tokens={args.max_tokens}, "
          f"{args.requests} requests per level; {cpu_name()}, {os.cpu_count()} cores")
    print("| clients | batcher | tokens/s | requests/s | median latency (s) | mean rows per batch | vs one at a time |"
          " load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mode = "max_batch 32" if r["max_batch"] > 1 else "one at a time"
        ratio = f"{r['tokens_per_s'] / alone[r['clients']]:.2f}x" if r["clients"] in alone else "-"
        print(f"| {r['clients']} | {mode} | {r['tokens_per_s']} | {r['requests_per_s']} | {r['latency_median_s']} | "
              f"{r['mean_batch_rows']} | {ratio} | {r['load_1min']} |")


if __name__ == "__main__":
    main()
