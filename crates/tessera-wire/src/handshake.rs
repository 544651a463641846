//! The handshake that opens every TCP connection (and sets up every datagram session): mutual
//! proof of a key over fresh nonces from both sides (see `tessera-auth`).
//!
//! ```text
//! connecting                                accepting
//!   Hello { claim, nonce_c, datagram }  ->
//!                                       <-  Challenge { nonce_a, proof_a }  |  Refused
//!   Proof { proof_c }                   ->
//!                                       <-  Welcome  |  Refused
//! ```
//!
//! Each message travels as the message of a frame (request frames one way, response frames
//! the other, request id 0) and is at most [`HANDSHAKE_MESSAGE_BYTES_MAX`] bytes. Nothing else
//! is read or answered on a connection before `Welcome`.

use serde::{Deserialize, Serialize};
use tessera_auth::{Claim, Nonce, Proof, Refusal};

/// Largest handshake message; a frame announcing more is a protocol violation.
pub const HANDSHAKE_MESSAGE_BYTES_MAX: u32 = 256;

/// One step of the handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Handshake {
    /// First message of the connecting side.
    Hello {
        /// The handshake version it speaks (`tessera_auth::HANDSHAKE_VERSION`).
        version: u8,
        /// Who it says it is; `None` for a peer without a credential, which is refused.
        claim: Option<Claim>,
        /// Its fresh nonce.
        nonce: Nonce,
        /// The datagram session this handshake keys, if it sets one up rather than opening a
        /// TCP connection for requests.
        datagram_session: Option<u64>,
    },
    /// The accepting side knows the claim's key: its fresh nonce and its proof.
    Challenge {
        /// Its fresh nonce.
        nonce: Nonce,
        /// Its proof of holding the key.
        proof: Proof,
    },
    /// The connecting side's proof.
    Proof {
        /// Its proof of holding the key.
        proof: Proof,
    },
    /// Authenticated: requests may follow (or the datagram session may start).
    Welcome,
    /// Refused; the connection is closed after this.
    Refused(Refusal),
}
