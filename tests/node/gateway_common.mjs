// What the gateway client scripts (gateway_stripe.mjs, gateway_octokit.mjs,
// gateway_ai_agent.mjs) share: their one JSON argument, the Intentlog headers, the pause a
// test kills them at, and the one JSON line they print.
import { createInterface } from "node:readline";

/** The script's spec: its one command-line argument, a JSON object. */
export function readSpec() {
  return JSON.parse(process.argv[2] ?? "{}");
}

/** The headers the gateway reads, from spec.task and spec.step (null ones are not sent). */
export function intentlogHeaders(spec) {
  const headers = {};
  if (spec.task != null) headers["Intentlog-Task"] = spec.task;
  if (spec.step != null) headers["Intentlog-Step"] = spec.step;
  return headers;
}

const WATCHED = [
  "intentlog-state",
  "intentlog-key",
  "intentlog-replay",
  "intentlog-reconciled",
  "idempotent-replayed",
  "retry-after",
  "content-type",
];

/** The answer's headers a test judges, by lower-case name (from an object or a Headers). */
export function watched(headers) {
  const out = {};
  const entries = typeof headers?.entries === "function" ? headers.entries() : Object.entries(headers ?? {});
  for (const [name, value] of entries) {
    if (WATCHED.includes(name.toLowerCase())) out[name.toLowerCase()] = value;
  }
  return out;
}

/** Say WHAT on stderr ("paused after ...") and wait for a line on stdin: the test SIGKILLs
 * the process once it read that line, or writes a line to let it go on. */
export async function pause(what) {
  process.stderr.write(`paused after ${what}\n`);
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  lines.close();
}

/** Print RESULT as one JSON line on stdout. A BigInt (Octokit parses an id past 2**53 as
 * one) is written as the JSON number it was read from. */
export function print(result) {
  const json = JSON.stringify(result, (_, value) =>
    typeof value === "bigint" ? JSON.rawJSON(value.toString()) : value,
  );
  process.stdout.write(json + "\n");
}
