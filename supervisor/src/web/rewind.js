// @ts-check
// Rewinding the open session's conversation: "Rewind to here" at a turn's end (the later
// turns leave the conversation, kept and marked rewound; the workspace may return to its
// state then), "Edit" on an earlier prompt (its text into the prompt box; sending it rewinds
// to the turn before it first, then sends), and the marks on rewound turns — from the
// timeline when a session opens, from `rewound` events as they come.
import { act, activity, rpc, showError } from "./app.js";
import { $, el, transcript } from "./render.js";
import { state } from "./state.js";

// Dims the transcript's nodes of `turnIds` (render.js's `transcript` records the turn each
// node belongs to) and takes their rewind and edit actions away.
export function markRewound(turnIds) {
  for (const id of turnIds || []) {
    for (const node of document.querySelectorAll(`#transcript [data-in-turn="${CSS.escape(id)}"]`)) {
      node.classList.add("rewound");
      for (const action of node.querySelectorAll(".rewind-here, .edit-prompt, .rewind-offer")) action.remove();
    }
  }
}

// The open session's rewound turns, from its timeline (after its events are rendered).
export async function showRewound(sessionId, visit) {
  let timeline;
  try {
    timeline = await rpc.call("task.session.timeline", { session_id: sessionId });
  } catch (_) {
    return; // the Timeline tab says why
  }
  if (state.visit !== visit) return;
  markRewound(timeline.turns.filter((turn) => turn.rewound).map((turn) => turn.turn_id));
}

// A turn end's "Rewind to here", which asks first (and whether to restore the workspace).
export function rewindButton(turnId) {
  const button = el("button", { type: "button", class: "rewind-here",
    title: "Make this turn the conversation's last: the later turns are kept, marked rewound, and the agent starts afresh from here" },
  "Rewind to here");
  button.addEventListener("click", () => offerRewind(button.parentElement, turnId));
  return button;
}

export function offerRewind(holder, turnId) {
  if (holder.querySelector(".rewind-offer")) return;
  const restore = el("input", { type: "checkbox", class: "rewind-restore" });
  const go = el("button", { type: "button", class: "rewind-go" }, "Rewind");
  const cancel = el("button", { type: "button", class: "rewind-cancel" }, "Cancel");
  const offer = el("div", { class: "rewind-offer" },
    "Rewind the conversation to this turn? The turns after it stay here, marked, and leave the agent's context. ",
    el("label", {}, restore, " also return the workspace to its state at this turn (what it has now is saved on a git ref first)"),
    " ", go, " ", cancel);
  go.addEventListener("click", async () => {
    if (await rewind(turnId, restore.checked)) offer.remove();
  });
  cancel.addEventListener("click", () => offer.remove());
  holder.append(offer);
}

export async function rewind(turnId, restoreWorkspace) {
  const rewound = await act("task.session.rewind",
    { session_id: state.open, turn_id: turnId, restore_workspace: restoreWorkspace || undefined });
  if (!rewound) return undefined;
  markRewound(rewound.rewound);
  // (The activity line comes with the session's `rewound` event.)
  return rewound;
}

// "Edit" on a person's prompt: its text goes into the prompt box, and sending it rewinds to
// the turn before it first (refused, and said, for the first prompt: there is no turn
// before it to rewind to).
export function editButton(turnId, text) {
  // Its word is the stylesheet's (`::before`), so the message's text stays the prompt's.
  const button = el("button", { type: "button", class: "edit-prompt", "aria-label": "Edit",
    title: "Edit this prompt and send it again: the conversation is rewound to the turn before it first" });
  button.addEventListener("click", () => startEdit(turnId, text));
  return button;
}

export async function startEdit(turnId, text) {
  let timeline;
  try {
    timeline = await rpc.call("task.session.timeline", { session_id: state.open });
  } catch (error) {
    showError(error);
    return;
  }
  const kept = timeline.turns.filter((turn) => !turn.rewound).map((turn) => turn.turn_id);
  const at = kept.indexOf(turnId);
  if (at <= 0) {
    showError(new Error(at === 0
      ? "the first prompt cannot be edited here: there is no turn before it to rewind to (fork the session or start a new one)"
      : "that prompt is no longer part of the conversation"));
    return;
  }
  state.editing = { before: kept[at - 1], turn: turnId };
  $("#prompt").value = text;
  $("#editing-text").textContent = `Editing an earlier prompt: Send rewinds the conversation to the turn before it (${kept.length - at} turn(s) leave it), then sends this.`;
  $("#editing").hidden = false;
  $("#prompt").focus();
}

export function stopEditing() {
  state.editing = null;
  $("#editing").hidden = true;
}

// Before an edited prompt is sent: the rewind to the turn before it; false when refused.
export async function rewindForEdit() {
  if (!state.editing) return true;
  const rewound = await rewind(state.editing.before, false);
  if (!rewound) return false;
  stopEditing();
  return true;
}
