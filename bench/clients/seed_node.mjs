// Benchmark client: the seed's Node client (callLLMWithDeadline, its default
// retries: 3, backoff 800 ms, Retry-After) driven the way its batch.mjs does,
// mapWithConcurrency(items, C, ...). The client is imported by path from
// $LLMRETRY_SEED_NODE (not copied into this repository; not set: the
// client exits 2 and the suite skips it). See README.md.
//
//   node bench/clients/seed_node.mjs --url BASE --concurrency C --requests N --warmup W
//
// Last line of stdout: {"ok", "failed", "seconds", "cpu_seconds"} of the timed
// batch; process.cpuUsage() counts every thread (libuv's and V8's too).
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const seedDir = process.env.LLMRETRY_SEED_NODE;
const clientPath = seedDir ? path.join(seedDir, "client.mjs") : "";
if (!seedDir || !fs.existsSync(clientPath)) {
  console.error(`seed_node: ${seedDir ? `no ${clientPath}` : "LLMRETRY_SEED_NODE is not set"} ` +
                "(the folder of the seed Node client, client.mjs; it is not in this repository)");
  process.exit(2);
}
const { callLLMWithDeadline, mapWithConcurrency } = await import(pathToFileURL(clientPath).href);

const { values } = parseArgs({
  options: {
    url: { type: "string" }, concurrency: { type: "string" },
    requests: { type: "string" }, warmup: { type: "string", default: "0" },
  },
});
const base = (values.url ?? "").replace(/\/+$/, "");
const C = Number(values.concurrency), N = Number(values.requests), W = Number(values.warmup);
if (!base || !(C >= 1) || !(N >= 1) || !(W >= 0)) {
  console.error("usage: node seed_node.mjs --url BASE --concurrency C --requests N --warmup W");
  process.exit(2);
}

const MAX_REPORTED = 5;
async function batch(count, name) {
  let ok = 0, failed = 0;
  const one = async () => {
    try {
      const { data } = await callLLMWithDeadline({
        baseUrl: base, apiKey: "bench-key",
        body: { model: "bench-model", messages: [{ role: "user", content: "Say hi" }] },
      });
      if (typeof data.choices[0].message.content === "string") { ok += 1; return; }
      throw new TypeError("choices[0].message.content is not a string");
    } catch (err) {
      failed += 1;
      // Only the message's first line: it never holds the key or the prompt.
      if (failed <= MAX_REPORTED) console.error(`${name}: request failed: ${String(err.message).split("\n")[0].slice(0, 200)}`);
    }
  };
  await mapWithConcurrency(Array.from({ length: count }, (_, i) => i), C, one);
  return { ok, failed };
}

if (W > 0) {
  const warm = await batch(W, "seed_node (warm-up)");
  if (warm.failed) console.error(`seed_node: ${warm.failed} of ${W} warm-up requests failed`);
}
const cpu0 = process.cpuUsage();
const t0 = performance.now();
const { ok, failed } = await batch(N, "seed_node");
const seconds = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
console.log(JSON.stringify({ ok, failed, seconds, cpu_seconds: (cpu.user + cpu.system) / 1e6 }));
