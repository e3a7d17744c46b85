// A session's confinement in words (sandbox.js), as `scripts/test.sh` runs it: `node --test`.
import { test } from "node:test";
import assert from "node:assert/strict";
import { confinementLabel, egressLine } from "../sandbox.js";

test("an unconfined session says so", () => {
  assert.equal(confinementLabel(undefined).text, "unconfined");
  assert.match(confinementLabel(null).title, /whole machine/);
});

test("a sandbox names its files, its hosts and which are model endpoints", () => {
  const label = confinementLabel({
    filesystem: "workspace", network: "allowlist", by: "bubblewrap",
    allow: ["registry.npmjs.org:443", "127.0.0.1:8080"], endpoints: ["127.0.0.1:8080"],
    readable: ["~/.claude"],
  });
  assert.equal(label.text, "sandboxed: workspace · 2 hosts");
  assert.match(label.title, /^Confined by bubblewrap\./);
  assert.match(label.title, /Also readable: ~\/\.claude\./);
  assert.match(label.title, /only registry\.npmjs\.org:443, 127\.0\.0\.1:8080 \(model endpoint\), through its egress proxy/);
  const offline = confinementLabel({ filesystem: "host", network: "none", by: "bubblewrap" });
  assert.equal(offline.text, "sandboxed: files · no network");
  assert.match(offline.title, /Network: no network\./);
});

test("a refusal names the host asked for", () => {
  assert.equal(egressLine({ target: "evil.example:443", reason: "x" }),
    "egress refused: the agent asked for evil.example:443, which is not on its allowlist");
});
