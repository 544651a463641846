//! The receive budget: receiver-driven flow control across all sessions of an endpoint.
//!
//! A client that reads a block striped over N servers asks all N at once, and all N answer
//! at once into the one switch port in front of it. If each sender may send a full window,
//! N windows overflow that port's small buffer, packets are lost in bursts and everyone
//! waits for a timeout: TCP incast (Phanishayee et al., FAST 2008). The receiver is the one
//! place that sees every flow toward that port, so it decides, as in ICTCP's receive-window
//! control (Wu et al., CoNEXT 2010) and Homa's grants (Montazeri et al., SIGCOMM 2018):
//!
//! - The endpoint has a budget of packets that may be granted and not yet arrived, summed
//!   over every session: about one bandwidth-delay product plus the switch buffer. Then the
//!   port's queue can never overflow, whatever the number of senders, and the link stays
//!   busy because a bandwidth-delay product is always granted.
//! - A session earns window only for messages the application said it expects (the answers
//!   to its requests, with their sizes), so nothing unasked-for takes budget.
//! - Grants go first come, first served by the oldest expected message (Homa grants the
//!   shortest remaining message first; for striped reads, whose blocks are all needed, the
//!   oldest request is the one whose completion unblocks the reader soonest). Each expected
//!   message competes under its own ticket, as each message does in Homa: a session whose
//!   oldest answer is granted whole claims for its next one only in that one's turn, so a
//!   client reading ahead does not let a server start its second answer and then stall it
//!   behind everyone's first.
//! - Requests wait for their grant ([`crate::Endpoint::request`]), the one that reaches into
//!   their own answer: the receiver here is also the requester, so it schedules when each
//!   server starts as well as how fast it sends. A server asked before it may answer wakes
//!   twice (request, then grant) and, on a busy host, acknowledges late enough to trip the
//!   client's retransmission timer.
//! - Like Homa's overcommitment, up to [`OVERCOMMIT_SESSIONS`] senders hold grants at once,
//!   each up to an equal share of the budget, so one slow or stalled sender does not idle the
//!   link; with fewer senders waiting each gets a larger share, a single one all of it.
//!
//! Grants are carried by the window field of ordinary ACKs: a receiver never takes back
//! window it advertised, which is exactly a grant that is never revoked. The budget counts a
//! lost packet as still granted until its retransmission arrives.

use crate::session::Claim;
use crate::SessionId;

/// Senders that may hold a share of the budget at once.
pub const OVERCOMMIT_SESSIONS: u64 = 4;

/// Splits the free budget among `claims` (sorted here by ticket): each claim gets up to an
/// equal share of the budget (`budget / min(claims, OVERCOMMIT_SESSIONS)`, rounded up) less
/// what it already holds, first come first served. Returns the grants, in packets.
pub(crate) fn allocate(
    budget: u64,
    promised_total: u64,
    claims: &mut [(SessionId, Claim)],
) -> Vec<(SessionId, u64)> {
    let mut free = budget.saturating_sub(promised_total);
    if free == 0 || claims.is_empty() {
        return Vec::new();
    }
    claims.sort_by_key(|(_, claim)| claim.ticket);
    let sharers = (claims.len() as u64).min(OVERCOMMIT_SESSIONS);
    let share = budget.div_ceil(sharers);
    let mut grants = Vec::new();
    for (id, claim) in claims.iter() {
        let room = share.saturating_sub(claim.promised);
        let packets = room.min(claim.wanted).min(free);
        if packets > 0 {
            grants.push((*id, packets));
            free -= packets;
            if free == 0 {
                break;
            }
        }
    }
    grants
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(ticket: u64, promised: u64, wanted: u64) -> Claim {
        Claim {
            ticket,
            promised,
            wanted,
        }
    }

    #[test]
    fn one_sender_may_take_the_whole_budget() {
        let mut claims = vec![(SessionId(1), claim(0, 0, 100))];
        assert_eq!(allocate(32, 0, &mut claims), vec![(SessionId(1), 32)]);
    }

    #[test]
    fn many_senders_share_among_the_oldest_few() {
        let mut claims: Vec<_> = (0..64)
            .map(|i| (SessionId(i), claim(63 - i, 0, 23)))
            .collect();
        let grants = allocate(32, 0, &mut claims);
        // Four shares of eight, to the four oldest tickets (the highest session ids here).
        assert_eq!(
            grants,
            vec![
                (SessionId(63), 8),
                (SessionId(62), 8),
                (SessionId(61), 8),
                (SessionId(60), 8)
            ]
        );
    }

    #[test]
    fn freed_budget_goes_to_the_next_once_the_oldest_want_nothing_more() {
        let mut claims = vec![
            (SessionId(1), claim(0, 3, 0)),
            (SessionId(2), claim(1, 8, 5)),
            (SessionId(3), claim(2, 0, 9)),
        ];
        // 3 + 8 promised of 32; shares of 11: session 2 may take 3 more, session 3 eleven.
        let grants = allocate(32, 11, &mut claims);
        assert_eq!(grants, vec![(SessionId(2), 3), (SessionId(3), 9)]);
    }

    proptest! {
        #[test]
        fn never_grants_past_the_budget_nor_past_what_is_wanted(
            budget in 1u64..200,
            claims in proptest::collection::vec((0u64..50, 0u64..60), 0..80),
        ) {
            let promised_total: u64 = claims.iter().map(|c| c.0).sum();
            let mut claims: Vec<_> = claims
                .iter()
                .enumerate()
                .map(|(i, &(promised, wanted))| (SessionId(i as u64), claim(i as u64, promised, wanted)))
                .collect();
            let before = claims.clone();
            let grants = allocate(budget, promised_total, &mut claims);
            let granted: u64 = grants.iter().map(|g| g.1).sum();
            prop_assert!(promised_total + granted <= budget.max(promised_total));
            for (id, packets) in &grants {
                let c = before.iter().find(|(i, _)| i == id).unwrap().1;
                prop_assert!(*packets > 0 && *packets <= c.wanted);
                let share = budget.div_ceil((before.len() as u64).min(OVERCOMMIT_SESSIONS));
                prop_assert!(c.promised + packets <= share);
            }
            // Work-conserving: budget left over only if no claim could take more.
            if promised_total + granted < budget {
                let share = budget.div_ceil((before.len() as u64).clamp(1, OVERCOMMIT_SESSIONS));
                for (id, c) in &before {
                    let got = grants.iter().find(|g| g.0 == *id).map_or(0, |g| g.1);
                    prop_assert!(got == c.wanted || c.promised + got >= share);
                }
            }
        }
    }
}
