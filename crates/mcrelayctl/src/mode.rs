//! `mcrelayctl standby` and `mcrelayctl active`: flip the daemon between
//! warm standby (every flow's sockets open and receiving, nothing sent)
//! and relaying. Both wait until every worker has the new mode, print it,
//! and exit 0; both are idempotent, as keepalived's notify script needs.

use std::process::ExitCode;

use mcrelay_control::{ModeOutcome, Request};

use super::Client;

/// Send `request` (`Standby` or `Active`) and print the outcome.
pub(super) fn set(client: &Client<'_>, request: Request, json: bool) -> anyhow::Result<ExitCode> {
    let outcome: ModeOutcome = client.ask(request)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        println!("{}", outcome.describe());
    }
    Ok(ExitCode::SUCCESS)
}
