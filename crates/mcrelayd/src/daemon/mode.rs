//! Warm standby (`daemon.mode`, `mcrelayctl standby|active`): every flow
//! keeps its sockets open, its groups joined and its receive armed, and a
//! standby worker discards what it receives instead of relaying it (see
//! `mcrelay_relay::standby`). Changing the mode is one command
//! to each worker, never a flow restart: the supervisor queues
//! `SetStandby` on every worker, waits for each to confirm, and publishes
//! the mode. A worker takes the command on its next loop turn: at once
//! when datagrams are arriving (each wakes it), within its 100 ms tick
//! when none are (when there is nothing to relay anyway).
//!
//! A reload keeps the mode: `daemon.mode` is only the mode at start, and
//! keepalived's decision must survive an operator's reload.

use std::time::Instant;

use mcrelay_control::{Mode, ModeOutcome};
use mcrelay_uring::{Command, Event};

use super::{COMMAND_TIMEOUT, Daemon, lock};

impl Daemon {
    /// The mode every worker has confirmed.
    pub fn mode(&self) -> Mode {
        lock(&self.shared).mode
    }

    /// Put every worker in `mode` and publish it once they have all
    /// confirmed; idempotent. An error says which workers did not take it
    /// (a worker that doesn't turn is also reported by the watchdog).
    pub fn set_mode(&mut self, mode: Mode) -> Result<ModeOutcome, String> {
        let previous = self.mode();
        let standby = mode.is_standby();
        let refused: Vec<usize> = self
            .workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.command(Command::SetStandby(standby)).is_err())
            .map(|(i, _)| i)
            .collect();
        if !refused.is_empty() {
            tracing::error!(?refused, %mode, "workers not taking commands; the mode may differ between workers");
            return Err(format!(
                "workers {refused:?} are not taking commands; the others are {mode}. See the daemon's log"
            ));
        }
        let mut pending: Vec<bool> = vec![true; self.workers.len()];
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while pending.iter().any(|&p| p) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::ModeSet { worker, standby: s }) if s == standby => {
                    if let Some(p) = pending.get_mut(worker) {
                        *p = false;
                    }
                }
                Ok(other) => tracing::warn!("late worker answer: {other:?}"),
                Err(_) => {
                    // Queued: each takes it when it turns again.
                    lock(&self.shared).mode = mode;
                    let late: Vec<usize> = (0..pending.len()).filter(|&i| pending[i]).collect();
                    tracing::error!(?late, %mode, "workers did not confirm the mode in time");
                    return Err(format!(
                        "workers {late:?} did not confirm {mode} within {COMMAND_TIMEOUT:?}; \
                         they take it when they turn again. See the daemon's log"
                    ));
                }
            }
        }
        lock(&self.shared).mode = mode;
        if previous != mode {
            tracing::warn!(%previous, %mode, "mode changed: {}", match mode {
                Mode::Active => "relaying every flow",
                Mode::Standby => "standby: receiving, sending nothing",
            });
        }
        Ok(ModeOutcome {
            mode,
            previous,
            workers: self.workers.len(),
        })
    }
}
