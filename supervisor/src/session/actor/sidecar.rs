//! The agent's sidecar as the actor holds it: the execution, a launch landing after a stop,
//! a stop's retire, background retires and fences, and a re-attach catching up.

use super::{AfterLaunch, CatchUp, Execution, Teardown};
use crate::session::{Reply, SessionError};

/// The agent's sidecar as the actor holds it: the execution, a launch landing after a stop,
/// a stop's retire, background retires, and a re-attach catching up.
#[derive(Default)]
pub(in crate::session) struct Sidecar {
    pub(in crate::session) execution: Option<Execution>,
    pub(super) after_launch: AfterLaunch,
    /// A stop's or detach's retire in flight, whose leftovers are recorded when it is done.
    pub(super) teardown: Option<Teardown>,
    /// Background retires and fences not finished yet (a launch waits for them).
    pub(super) retiring: Vec<tokio::task::JoinHandle<()>>,
    /// After a re-attach: what waits for agentctl's replay to catch up.
    pub(in crate::session) catch_up: CatchUp,
}

impl Sidecar {
    /// Remembers a background retire or fence: the next launch waits for it, so a fence
    /// that runs late can never hit the execution launched after it.
    pub(in crate::session) fn keep_retiring(&mut self, task: tokio::task::JoinHandle<()>) {
        self.retiring.retain(|task| !task.is_finished());
        self.retiring.push(task);
    }

    /// A launch or re-attach in flight is retired when it lands; `reply` (a detach's) is
    /// answered once that is done.
    pub(in crate::session) fn retire_on_landing(&mut self, reply: Option<Reply<()>>) {
        match &mut self.after_launch {
            AfterLaunch::Retire(waiters) => waiters.extend(reply),
            AfterLaunch::Keep => {
                self.after_launch = AfterLaunch::Retire(reply.into_iter().collect())
            }
        }
    }

    /// A stop or detach came while launching or re-attaching: clears the request and
    /// returns the reply to give once the retire is done (other callers are answered now).
    pub(in crate::session) fn stop_after_launch(&mut self) -> Option<Reply<()>> {
        let AfterLaunch::Retire(mut waiters) =
            std::mem::replace(&mut self.after_launch, AfterLaunch::Keep)
        else {
            return None;
        };
        let reply = waiters.pop();
        for other in waiters {
            let _ = other.send(Ok(()));
        }
        reply
    }

    /// A re-attach's replay will not finish (the execution is gone): prompts that waited for
    /// it are answered (the caller resumes and retries), and nothing is left to settle.
    pub(in crate::session) fn drop_replay(&mut self, reason: &str) {
        self.catch_up.until = None;
        self.catch_up.undelivered.clear();
        for (_, reply) in self.catch_up.deferred.drain(..) {
            let _ = reply.send(Err(SessionError::AgentGone(reason.to_owned())));
        }
    }
}
