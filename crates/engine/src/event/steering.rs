//! The payloads of live steering: a person's message to a running run, recorded once when
//! it is sent, and its delivery to the one model call that took it.

use serde::{Deserialize, Serialize};

/// A person's message to a running run (`baton steer`, `POST /runs/{id}/steer`, MCP
/// `run_steer`), recorded once. The next model call of a steerable level takes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SteeringReceived {
    /// The message's id within its run: `steer-N`, numbered from 1 in the order recorded.
    pub id: String,
    /// Who sent it (the token's holder on the server, `--by` on the command line).
    pub by: String,
    /// The message, as the person wrote it (at most 8 KiB of text).
    pub message: String,
}

/// The steering messages one model call took (a level event, recorded with the call's
/// answer): each message is delivered once. A call that failed delivered nothing; its
/// messages go to the next call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SteeringDelivered {
    /// The messages, by id, in the order they were sent.
    pub ids: Vec<String>,
    /// The call that took them (its `call_index` in the run).
    pub call_index: u32,
}
