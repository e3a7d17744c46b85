// @ts-check
// A session's confinement in words: the label beside its title and the line an egress
// refusal draws. Pure (no page, no daemon): `app.js` and `render.js` draw with it,
// `tests/sandbox.test.js` runs it under `node --test`.

/**
 * A confinement as `task.session.status` gives it (`Confinement`; absent: unconfined).
 * @typedef {{ filesystem: string, network: string, allow?: string[], endpoints?: string[], readable?: string[], writable?: string[], by?: string }} Confinement
 */

/**
 * The label beside a session's title (short) and its tooltip (everything).
 * @param {Confinement | undefined | null} sandbox
 * @returns {{ text: string, title: string }}
 */
export function confinementLabel(sandbox) {
  if (!sandbox) {
    return { text: "unconfined", title: "The agent sees the whole machine and network its user may (no [sandbox] in its profile)." };
  }
  const files = sandbox.filesystem === "workspace" ? "its workspace" : "the whole file system";
  const allow = sandbox.allow || [];
  const net = {
    allowlist: allow.length === 1 ? "1 host" : `${allow.length} hosts`,
    none: "no network",
    host: "any host",
  }[sandbox.network] || sandbox.network;
  const lines = [
    `Confined by ${sandbox.by || "nothing on this runtime"}.`,
    `Files: ${files}${sandbox.filesystem === "workspace" ? " (and its own state; the system read-only)" : ""}.`,
  ];
  if (sandbox.readable && sandbox.readable.length) lines.push(`Also readable: ${sandbox.readable.join(", ")}.`);
  if (sandbox.writable && sandbox.writable.length) lines.push(`Also writable: ${sandbox.writable.join(", ")}.`);
  if (sandbox.network === "allowlist") {
    const endpoints = sandbox.endpoints || [];
    const named = allow.map((entry) => endpoints.includes(entry) ? `${entry} (model endpoint)` : entry);
    lines.push(`Network: only ${named.length ? named.join(", ") : "nothing"}, through its egress proxy.`);
  } else {
    lines.push(`Network: ${net}.`);
  }
  return { text: `sandboxed: ${sandbox.filesystem === "workspace" ? "workspace" : "files"} · ${net}`, title: lines.join("\n") };
}

/**
 * What an `egress_refused` event says.
 * @param {{ target: string, reason: string }} event
 * @returns {string}
 */
export function egressLine(event) {
  return `egress refused: the agent asked for ${event.target}, which is not on its allowlist`;
}
