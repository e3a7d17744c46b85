// @ts-check
// The page's state: one object, owned by this module and imported by the modules that
// read and change it (the list, the open session's transcript and its windows, the
// review). Each field says what it holds.

export const state = {
  tasks: [],
  // The open session's prompt queue, as last shown.
  queue: null,
  sessions: [],
  workflows: [],
  openWorkflow: null, // the workflow shown
  workflowSeq: 0, // the newest event seq of the workflow status shown
  workflowsFollowed: false, // the workflow list's one subscription is up on this connection
  workflowsHeld: null, // while the workflow list is read: the changes that came meanwhile
  agents: [],
  open: null, // the session shown
  following: null, // the subscription that renders the open session: { id, token }
  followToken: 0,
  lastSeq: new Map(), // session id → the last event seq rendered
  resumedThisVisit: new Set(),
  listFollowed: false, // the list's one subscription is up on this connection
  currentAgent: null, // the agent message block being streamed into
  currentThought: null,
  tools: new Map(), // tool call id → { fields, node }
  permissions: new Map(),
  plan: null, // the open turn's plan box
  step: null, // the launch step waited in, with its activity line (render.js `stepProgress`)
  backfill: null, // the holder an earlier window of events is rendered into
  backfillBlocks: new Set(), // its agent messages, rendered once it is in
  visit: 0, // each opening of a session: answers for an older one are dropped
  live: false, // the open session's newest window is shown and followed
  windowStart: 0, // the oldest event seq rendered (an earlier window ends before it)
  turns: [], // the open session's turns, numbered (turns.js), where each starts in the log
  pinned: null, // the seq of the newest prompt shown above a window that starts inside its turn
  answers: new Map(), // permission request id → how it was answered
  lastTurnEnd: 0, // the seq of the newest turn end rendered
  stick: true, // the transcript follows new output
  unseen: new Set(), // sessions whose turn ended while nobody looked
  needsYou: new Set(), // sessions announced as needing a person (for notifications)
  list: { query: "", state: "", agent: "", task: "", sort: "newest", shown: 50 },
};
