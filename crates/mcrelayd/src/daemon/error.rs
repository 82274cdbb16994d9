//! The supervisor's errors, one enum per operation: starting the daemon,
//! and moving one flow on or off its worker.

use std::time::Duration;

use mcrelay_uring::WorkerError;

use super::placement::PlacementError;
use crate::sockets::OpenError;

/// Why the daemon did not start (nothing runs afterwards: workers already
/// started are stopped).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No worker for a flow, or bad `daemon.cores`.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// A flow whose interfaces are up could not get its sockets.
    #[error(transparent)]
    Open(OpenError),
    /// The second handle on an ingress socket (for its drop counter).
    #[error("duplicating the ingress socket for its drop counter")]
    Ingress(#[source] std::io::Error),
    /// What had to happen before the workers start (the privilege drop).
    #[error(transparent)]
    BeforeWorkers(Box<dyn std::error::Error + Send + Sync>),
    /// A worker could not start.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// Why a flow could not be put on, or taken off, its worker.
#[derive(Debug, thiserror::Error)]
pub enum FlowCommandError {
    /// Its sockets could not be opened (through the helper or directly).
    #[error(transparent)]
    Open(OpenError),
    /// The second handle on its ingress socket (for its drop counter).
    #[error("duplicating the ingress socket for its drop counter")]
    Ingress(#[source] std::io::Error),
    /// The flow is not in the readers' table (an internal inconsistency).
    #[error("flow not published")]
    NotPublished,
    /// Its worker index names no worker (an internal inconsistency).
    #[error("no such worker")]
    NoSuchWorker,
    /// The worker's command queue is full or the worker has stopped.
    #[error("worker {worker} is not taking commands")]
    NotTakingCommands { worker: usize },
    /// The worker did not answer in time.
    #[error("no answer from the worker within {timeout:?}")]
    NoAnswer {
        timeout: Duration,
        #[source]
        source: std::sync::mpsc::RecvTimeoutError,
    },
    /// The worker refused to add the flow.
    #[error("worker {worker} refused it: {answer}")]
    Refused { worker: usize, answer: String },
    /// The worker answered a removal with something else.
    #[error("unexpected answer {answer}")]
    Unexpected { answer: String },
}
