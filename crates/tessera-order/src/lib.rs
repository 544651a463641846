//! Uniform total order broadcast with the network as sequencer, as a sans-IO state machine,
//! with a deterministic simulator of the two-switch topology and a checker of histories.
//!
//! This crate owns the ordering protocol of Greenman's "High Speed Total Order for SAN
//! infrastructure" (`papers/high-speed-total-order-san.txt`): every node sends through one
//! switch and receives through a second, the two joined by one link, so that all receivers
//! see all messages in the same *preliminary order* (PO) almost always; a cheap round of
//! ACKs turns that order into the *uniform total order* (UTO) of the paper's section 2.2
//! (UTO1 uniform agreement, UTO2 termination, UTO3 uniform total order, UTO4 integrity, and
//! FIFO per sender). It must never do I/O: no sockets, threads, clocks or unseeded
//! randomness. Time comes in as `now: Micros`, randomness from the seed given to
//! [`Node::new`], packets in through [`Node::handle_packet`] and out through
//! [`Node::poll_transmit`]. [`sim`] runs the very same code; [`check`] judges what it did.
//!
//! # Driving a node
//!
//! As `quinn-proto` and `tessera-datagram`: feed inputs ([`Node::propose`],
//! [`Node::handle_packet`], [`Node::handle_timeout`]), then drain every output before waiting
//! again: [`Node::poll_transmit`] until `None` (send each packet to its [`Destination`]: a
//! broadcast goes through the sequencer link to every node, the sender included),
//! [`Node::poll_event`] until `None`, and [`Node::poll_timeout`], the time by which
//! `handle_timeout` must be called if nothing else arrives first. `now` never goes back.
//!
//! ```
//! use bytes::Bytes;
//! use tessera_order::{Config, Event, Group, Node, NodeId, Start};
//!
//! // Three nodes, each a sender and a receiver; the network is perfect and FIFO.
//! let group = Group::all_to_all(3);
//! let mut nodes: Vec<Node> = (0..3)
//!     .map(|i| Node::new(Config::default(), group.clone(), NodeId(i), 0, Start::Initial, i as u64, 0))
//!     .collect();
//! nodes[1].propose(Bytes::from_static(b"hello"), 0).unwrap();
//! let mut delivered = vec![Vec::new(); 3];
//! for now in (0..2_000).step_by(10) {
//!     let mut wire = Vec::new();
//!     for node in nodes.iter_mut() {
//!         while let Some(transmit) = node.poll_transmit(now) {
//!             wire.push(transmit.contents);
//!         }
//!     }
//!     for packet in &wire {
//!         for node in nodes.iter_mut() {
//!             node.handle_packet(packet, now);
//!         }
//!     }
//!     for (i, node) in nodes.iter_mut().enumerate() {
//!         if node.poll_timeout().is_some_and(|deadline| deadline <= now) {
//!             node.handle_timeout(now);
//!         }
//!         while let Some(event) = node.poll_event() {
//!             if let Event::Deliver { position, message, .. } = event {
//!                 delivered[i].push((position, message));
//!             }
//!         }
//!     }
//! }
//! for log in &delivered {
//!     assert_eq!(log, &vec![(0, Bytes::from_static(b"hello"))]);
//! }
//! ```
//!
//! # Protocol
//!
//! **Group and views.** The group is known ([`Group`]): up to [`GROUP_NODES_MAX`] nodes, each
//! a sender, a receiver or both. The receivers hold the order. They move through numbered
//! *views*; a view has a set of *members* (receivers, at least a majority of all of them)
//! and a *leader*, receiver number `view mod receivers`. View 0 has every receiver.
//! Positions are global: they go on across views. The group itself changes by ordered
//! group changes (below); each view runs one group.
//!
//! **Fast path (sections 3.1-3.2).** A sender numbers its messages 0, 1, 2... (FIFO) and
//! broadcasts them in DATA packets; at most `window_packets` of its packets may hold
//! messages that some member of the view does not yet hold (local flow control: the ACKs
//! count, per sender, the messages a member's log holds, in whatever order), and at most
//! [`RETAINED_WINDOWS`] windows' worth may be undelivered. The sequencer link's queue is
//! finite: a sender halves its window (down to `window_packets_min`) when an own packet
//! does not come back through the network, at most once a round trip, and grows it by one
//! packet per window of own DATA packets back (TCP's AIMD; only the pace changes, never
//! what is delivered or where). The messages this
//! defers are packed together into packets of at most `mtu_bytes` (the paper's Nagle-like
//! aggregation: when the window slides by `n`, up to `n` full packets go out; with
//! `aggregate` off each message goes alone). A member appends each message to its log in
//! arrival order, if it is the next of its sender (a later one waits, and the gap is NACKed
//! to its sender), and delivers it at once as PO ([`Event::Optimistic`]). It acknowledges
//! its log as `(view, length, hash)`, where the hash chains the identities of every message
//! in the log, after `ack_every_messages` appends or `ack_delay_us` (the threshold of ACK
//! aggregation; at once when idle, its last ACK packet a delay ago and no queue on the
//! sequencer link: `ack_at_once_when_idle`), piggybacked on its DATA when it sends; and
//! once more two round trips through an empty queue later (under load a fresh ACK follows sooner) unless another ACK
//! follows first (a lost last ACK of a burst would otherwise hold a member's deliveries
//! until the next heartbeat), and again, each pause twice the last up to
//! a heartbeat interval, while some member reports fewer deliveries than its log holds. A
//! member whose log the leader's order replaced compares every member's latest ACK again
//! (it conflicted with the log it had). A member that holds ACKs from every
//! member of the view whose `(length, hash)` equal its own log's at that length knows that
//! every member holds the same messages at every position below it: it UTO-delivers them
//! ([`Event::Deliver`]). Nobody waits for the leader for this.
//!
//! **Loss.** A sender keeps each message until some node reports it UTO-delivered (the
//! per-sender counts of delivered messages in every ACK, or its own delivery); its window
//! slot opens earlier, once every member holds it, so that a hole in one member's log stops
//! delivery for a while but not the network. It retransmits a message that some member
//! does not hold after `retransmit_after_us` (or twice the time members took to hold its
//! messages lately, if longer: under load the queues, at most 8 times the setting), at once
//! when NACKed (unless it sent it again
//! less than half a round trip ago: another receiver's NACK of the same loss), and at once
//! when a later broadcast of its own came back before the DATA packet that carried it (the
//! packet was lost; a lost last packet shows nobody a gap). A receiver NACKs a gap in a
//! sender's numbering, and a message that another member's ACK counts (as held or
//! delivered: that ACK crossed the sequencer link after the DATA) but it lacks, at most
//! once per sender every two round trips (one NACK names a range), and again every two
//! round trips while that sender's gap stays open. The round trip is measured on the node's own
//! broadcasts ([`rtt`]), which cross the sequencer link's queue as repairs do. Where
//! members' logs disagree (one lost a message and appended later ones before its
//! retransmission), the leader's order takes over (section 3.4.2, Pedone and Schiper's
//! optimistic atomic broadcast): the leader, seeing an ACK whose hash differs from its own
//! log at that length, at once (again only after two round trips, unless the member took
//! the last repair; this round trip is at least twice the age of the leader's oldest
//! broadcast not yet back, so a queue filling faster than samples return still paces
//! it), or a member that has not matched its log for four round trips, sends
//! that member ENTRIES: its own order from the last position they agreed on to the end of
//! its log (in several packets if need be), as message identities in runs of one sender's
//! consecutive messages, without their bytes: the member holds them, in its log or held
//! back. (Bytes go only for crashed senders' messages, which only the leader can give, and
//! once two repairs went unanswered, for all the member's ACK did not count.) The member
//! sets its log aside from the first position where it differs from the leader's, and only
//! there, appends the leader's order, then what it set aside and held back in the order
//! it arrived (the leader's order past its ENTRIES, unless it lost more), and ACKs the
//! prefix the leader sent. If it lacks a message of the leader's order, it NACKs its
//! sender and appends nothing else until it has it.
//!
//! **Pausing after a loss (bounded repair).** A receiver that appended on past a lost
//! message has to have every position from the lost message's place to its log's end
//! replaced; under load (thousands of messages in flight per sender) that was thousands of
//! positions per loss, each set aside, appended again and reported again as PO. So a
//! receiver *pauses* its log as soon as it learns that its order may differ from the
//! others': a new gap in a sender's numbering (a later message of it arrived), a sender's
//! ACK counting messages it sent that we hold nowhere (every ACK carries `sent`, the
//! messages its node sent before it: in a FIFO network they crossed the sequencer link
//! before the ACK, so we lost them, even when that sender sent nothing after them yet),
//! or, at a member, an ACK of the leader that conflicts with its log. While paused it
//! appends nothing and holds what arrives (still counted as held in its ACKs, so flow
//! control goes on). It resumes when every gap is filled: the leader at once (its order
//! is the reference), a member unless the leader's ACKs past its log contradict the order
//! it would append (then the leader's repair is on its way); a member paused by a
//! conflict resumes when an ACK of the leader at least as long as the conflicting one
//! agrees with its log and that order, or when the leader's ENTRIES were followed. It
//! resumes in any case four round trips after it paused (a gap whose sender crashed).
//! On resuming it appends what it holds in arrival order, except that a message that
//! filled a gap goes where it was noticed missing: just before the first of its sender's
//! later messages that arrived (or where the ACK that counted it arrived). That is where
//! the receivers that did not lose it appended it at the latest, and where every receiver
//! puts a message that all of them lost, so a loss at one receiver leaves its log
//! different from the others' only between the message's place and the pause; the
//! leader's repair replaces those positions and the log goes on in place past them.
//!
//! **Failure (section 3.4.1).** Every packet carries the sender's view and status and counts
//! as a heartbeat; a node that has sent nothing for `heartbeat_interval_us` sends one. A
//! member that hears nothing from another member for `suspect_after_us` suspects it and
//! starts a view change.
//!
//! **View change.** The slower, safe ordering is a view change in the manner of
//! Viewstamped Replication and NOPaxos, rather than the paper's per-message Paxos
//! (announce and precommit to majorities for every message): the fast path stays the
//! paper's, and consensus runs only once per failure, to agree on which log the new view
//! starts from and who is in it. This choice keeps the common case at one ACK round and no
//! leader, where a per-message Paxos would add two majority rounds to every message while a
//! node is down; and it reuses a proof that is well trodden (VR revisited, NOPaxos). A node
//! starting a view change to view `v` sets its status to changing, stops appending and
//! acknowledging, tells everyone (its heartbeat says so, and nodes join the highest view
//! change they hear of) and sends DO-VIEW-CHANGE to `v`'s leader: its log from the lowest
//! position some member of its view had not delivered (below it every member delivered, and
//! by I5 every later log holds it), the last view it was a normal member of, and what it
//! delivered. The
//! leader waits for these from a majority of all receivers that hold state (a restarted
//! node does not count), then for the others: a heartbeat interval, or up to half a
//! view-change timeout while one heard from lately has not voted (else a live node whose
//! long vote is slow on the wire is left out, asks to join, and starts the next view change,
//! every time). It chooses the log of the node whose
//! last normal view is highest (the longest among those), extended downward from the vote
//! of a node that delivered those positions, to the lowest one some voter has not delivered; it sends START-VIEW with that
//! log, the members (every node whose DO-VIEW-CHANGE it has) and the highest delivered
//! position reported (the log from the lowest position a voter had not delivered). Members
//! adopt it and return to the fast path.
//!
//! Under load these logs are far longer than one datagram (a window of undelivered
//! messages per sender). Both messages go as a sequence of *parts*, each within
//! `repair_bytes_max` bytes, each repeating what the message says besides its entries and
//! the hash chain at the image's end; the receiver keeps the parts until they cover the
//! image and checks the whole against that hash before it counts the vote or adopts the
//! view. Parts get lost: the leader asks a voter whose parts stopped short for two round
//! trips (or who announced the view change and sent none) for the missing positions
//! (MISSING), and a voter that hears a normal member of the view it waits for asks the
//! leader the same; the answer is the same parts again (the split depends only on the log,
//! which neither changes meanwhile), at most [`REPAIR_PACKETS_MAX`] per question. A node that finds it is
//! not a member (excluded, or restarted) says so in its heartbeats ("joining"), and the
//! leader starts another view change to let it in. A view change that does not finish
//! within `view_change_timeout_us` (plus jitter) moves to the next view and leader.
//!
//! **Read leases** ([`Config::read_leases`], off by default; the replicated manager turns
//! them on). An application that answers reads from its own state at a member needs to
//! know the member was not left out of a view it has not heard of yet.
//!
//! *The problem.* An application that reads locally at a member waits until it has
//! applied its log as far as the log reaches (`Node::log_end`): in the fast path every
//! delivery needs every member's ACK, so every change acknowledged anywhere lies in that
//! stretch. But a member cut off from the others keeps its normal status until its own
//! failure detector fires, while the others may have changed view without it and
//! delivered (and the application acknowledged) changes it will never see in time. A read
//! answered there in between returns a state older than an acknowledged change.
//!
//! *The lease.* Member `R`, normal in view `v` with members `V`, holds a lease from `s`,
//! the time it first sent one of its own messages `m`, once every other member of `V` has
//! ACKed, in `v`, a log that holds `m` (their per-sender held counts reach it); the lease
//! runs until `s + lease_us` with `lease_us` three quarters of `suspect_after_us`
//! ([`Node::read_lease_ends`]). Each such member `Y` sent an ACK counting `m` at a time
//! `a_Y >= s` (it held `m`, which `R` first sent at `s`, whatever path `m` took to it).
//!
//! *The rule* that makes it hold: a node remembers, per node `X`, when it last sent an
//! ACK, in a view `X` was a member of, that counted more of `X`'s messages than any such
//! ACK before (`fresh`; a removed or left-out node that goes on sending must not hold
//! every later view back), and it does not enter a view (adopt a START-VIEW, or send one
//! as leader) that leaves out a member `X` of the last view it was normal in until
//! `suspect_after_us` has passed since `fresh[X]`; a node
//! that restarted (it forgot everything) enters no view until `suspect_after_us` after its
//! start. A node that suspects `X` heard nothing from it for that long anyway, so a view
//! change after a crash is not slowed; one started for another reason (another suspect, a
//! node asking to join) that leaves out a node heard lately waits.
//!
//! *Why no change acknowledged before a read at `R` inside its lease is missing from the
//! read.* Deliveries in `v` need `R`'s ACK, so they lie below `R`'s log end. `R` is still
//! normal in `v`, so it voted in no later view and is a member of none: every view after
//! `v` leaves it out. Take the views after `v` in the order they were started (a START-VIEW
//! sent). Each needs votes of a majority of all receivers that hold state; `V` is a
//! majority too, so that majority holds a node `Y` of `V` other than `R`. `Y` holds state
//! either since `v` (then the first view after `v` it entered left `R` out: it entered at
//! or after `a_Y + suspect_after_us`), or because it restarted and entered a later view
//! (not before its start plus `suspect_after_us`, and its start came after `a_Y`). Either
//! way `Y` is a member of that view and delivers nothing in it before `s +
//! suspect_after_us`; every delivery needs every member's ACK in the view, and a START-VIEW
//! delivers only positions some earlier view delivered. So every position delivered after
//! `v` was delivered after `s + suspect_after_us`, past the lease's end. The margin (a
//! quarter of `suspect_after_us`) covers clocks that run at different rates (up to about
//! 14 %) and the time between the application's check and its read of the log end.
//!
//! What it costs: a member that proposed nothing for `lease_us` has no lease, so its
//! application orders the read (which proposes, and renews the lease); a view change that
//! leaves out a node heard lately waits out `suspect_after_us`.
//!
//! **Catching up below a view's log.** A view's log begins at the lowest position some
//! voter had not delivered, as far down as some vote carries it. A member that had not
//! delivered as far (it voted from another view, and the leader does not retain those
//! positions) asks the view's members for them (FETCH: the range, and the part of it still
//! lacking), one member every two round trips, in turn, the one that answered last first;
//! a member that retains them below its own view's log answers with the parts of that one
//! image, each within `repair_bytes_max` (LOG-PART), at most [`REPAIR_PACKETS_MAX`] per
//! question. The image is taken whole, if its hash chain begins at the member's own hash
//! where its deliveries stopped and ends at the view log's first hash, and its counts agree
//! at both ends; the member delivers nothing until then. After four questions to every
//! other member (or a view change), or past [`FETCH_POSITIONS_MAX`] positions, it reports
//! [`Event::Gap`] instead: the application's state transfer.
//!
//! **Orphans.** Messages of a crashed sender that reached some members but not the leader
//! cannot be retransmitted to it. A member whose log matches the leader's ACK up to its
//! length and goes on past it only with messages of earlier incarnations drops them; they
//! lie past every delivered position, since the delivered prefix is the leader's.
//!
//! **Restart.** A node that restarts has lost its memory; it comes back with a higher
//! incarnation (the driver keeps it: a counter in a file, or the clock) and [`Start::Restarted`].
//! Its messages of earlier incarnations are no longer retransmitted. As a receiver it
//! holds nothing, so it does not count toward a view change's majority; it joins a view,
//! takes its log and delivers from that view's highest delivered position on
//! ([`Event::Joined`]); what came before is the application's state transfer (the
//! replicated manager's snapshots).
//!
//! **Group changes.** Adding or removing a node is itself a message:
//! [`Node::propose_group_change`] broadcasts a [`GroupChange`] (`node` has `role` from
//! epoch `e` on) in the same FIFO stream as the sender's messages; every message in a log
//! carries one byte saying which it is. The initial group is epoch 0; a change takes effect
//! where it is UTO-delivered if it names the next epoch ([`GroupRecord::apply`]; one that
//! lost a race names a taken epoch and changes nothing), and it changes one node, so at
//! most one receiver. Each view runs one group, a [`GroupRecord`] (its epoch, senders,
//! receivers, and the receivers before it) carried in START-VIEW: the leader, the members,
//! failure detection and the view-change majority are that group's. A view of epoch `e`
//! delivers nothing past the change that makes `e + 1` (every node delivers in order, so
//! each stops at the same position): the messages ordered before it count the old group's
//! ACKs. A node that delivered it knows a newer group than its view's and starts a view
//! change; a view change runs the newest group its node knows, so the next view runs the
//! new group and the messages after the change count the new group's ACKs. Every header
//! carries the low byte of the newest epoch its sender knows; a node that knows a newer
//! one tells it (GROUP, kind 11, taken from any node: one that missed changes may not know
//! who tells it), and a DO-VIEW-CHANGE carries its voter's newest group: a leader that
//! hears of a newer group than its own starts the view change again with it. A removed
//! node is no member of the new view and stops being waited on (its packets are stale to
//! the group's members; [`Event::Removed`] tells its application to stop it). An added
//! node starts with [`Start::Added`]: it holds nothing (like a restarted node it counts
//! toward no majority), learns the group from its peers, votes, is made a member by the
//! next view change and delivers from that view's highest delivered position on
//! ([`Event::Joined`]): the state before it, the change's position included, is the
//! application's state transfer.
//!
//! # Safety argument
//!
//! The claim: no two nodes UTO-deliver different messages at one position, in any view,
//! whatever the network does (loss, duplication, reordering, partitions) and whichever
//! nodes crash and restart, as long as at no time a majority of the receivers has lost its
//! memory. Each message type keeps one invariant:
//!
//! - **Release** (I0): a sender forgets a message only once some node delivered it in UTO;
//!   by I5 below it is then in the log of every later view, so no member ever needs it from
//!   the sender again. (Forgetting on mere presence in every member's log would not do: a
//!   late ENTRIES may set it aside, and a view change drop it, from a follower's undelivered
//!   suffix. Presence frees only the window slot, which is about the network's queue, not
//!   about safety.)
//! - **Pausing** keeps no invariant of its own and needs none: it only delays appends and
//!   chooses the order in which a receiver appends what it holds (each sender's messages
//!   still in FIFO order, I1); it replaces no position. Any receiver may append in any
//!   order: a position is delivered only where every member's ACK agrees (I2), and a
//!   member's positions are replaced only by the leader's ENTRIES (I3). A pause that
//!   guesses wrong costs a repair, never safety; the `sent` count in ACKs only makes a
//!   receiver NACK and pause.
//! - **DATA** (I1, FIFO): a log holds each sender's messages as a prefix `0..k` of its
//!   numbering; [`log::Log::append`] asserts it. Duplicates and reordered packets are
//!   dropped or held, never appended twice.
//! - **ACK** (I2, agreement on prefixes): an ACK `(view v, length n, hash h)` is sent only by
//!   a normal member of `v`, about its own log. Since `h` chains every identity below `n`,
//!   a node whose log has hash `h` at `n` holds the same messages at positions `0..n`. A node
//!   delivers position `p` in view `v` only with such matching ACKs at lengths `> p` from
//!   every member of `v`, so at that moment every member of `v` holds the same prefix `P`
//!   through `p`, the leader included.
//! - **ENTRIES** (I3, the leader's log is the reference): within a view the leader never
//!   changes its own log, and a follower replaces its log only from the first position where
//!   it differs from the leader's entries, after checking that the leader's hash before
//!   `from` equals its own. Since every delivered prefix is a prefix of the leader's log
//!   (I2), the first difference lies past it: a member of `v` never loses `P` while in `v`,
//!   even when ENTRIES packets arrive late or out of order.
//! - **DO-VIEW-CHANGE** (I4, promise): a node that sends it for view `v'` has stopped
//!   appending and acknowledging in every view below `v'`; it reports its log as it was, so
//!   the log contains everything it ever acknowledged as a member of its last normal view.
//! - **FETCH and LOG-PART** keep no invariant of their own either: the fetched image is
//!   taken only whole, when its hash chain runs from the member's own hash at its last
//!   delivery to the view log's hash at its first position, so it holds exactly the
//!   positions below the view's log that the view's voters delivered (I5), in order.
//! - **Parts and MISSING** keep no invariant of their own: a vote or START-VIEW takes effect
//!   only whole, checked against the hash chain at its end, so it is the message the
//!   sender meant; MISSING only makes a node send a part again.
//! - **START-VIEW** (I5, the new log extends every delivered prefix): the leader of `v'`
//!   chooses among DO-VIEW-CHANGEs from a majority of the receivers that hold state. Let `p`
//!   have been delivered in view `v < v'`. The members of `v` are at least a majority, so
//!   the majority answering for `v'` includes a member `m` of `v`. By induction on views, the
//!   log of any node whose last normal view is `u >= v` contains `P`: for `u = v` by I2-I4;
//!   for `u > v`, because its log began as START-VIEW(`u`)'s, which contains `P` by this same
//!   argument, and changed since only by appends and by I3. The chosen log has the highest
//!   last normal view, at least `m`'s, which is `>= v`: it contains `P`. Positions the
//!   leader adds below the chosen log's first retained one come from another vote whose
//!   node delivered them too (not merely holds them: a stale log may hold an older view's
//!   replaced suffix there); both delivered them, so both agree (the leader asserts that the
//!   two hash chains meet). A restarted node counts for no majority, since it may have forgotten a
//!   promise or a prefix.
//! - **Group changes** (I6, every view change meets the members of every view that
//!   delivered): the leader needs votes from a majority of the receivers of the group it
//!   runs, the newest `K` that it or any voter knows (epochs only grow at a node, and a
//!   vote naming a newer one restarts the view change). Views that delivered something
//!   (*established*: every member adopted them) run epochs that never decrease with the
//!   view number, and epoch `k + 1` runs only after a view of epoch `k` delivered its change.
//!   Let `P` be delivered in view `v` of epoch `j`, members `M` (a majority of `j`'s
//!   receivers). Since a change moves one receiver, any majority of epoch `k` meets any
//!   majority of epoch `k ± 1`. If `j > K`, an established view of epoch `K + 1` below the
//!   new one has members meeting the voters, one of which would know `K + 1`: impossible.
//!   If `j` is `K` or `K - 1`, the voters meet `M` and I5's induction holds as is. If
//!   `j <= K - 2`, an established view `y > v` of epoch `K - 1` exists, its START-VIEW holds
//!   `P` (induction on views) and its members meet the voters: the chosen log's last normal
//!   view is `>= y`, so it holds `P`. Sealing the old group's view at its change keeps the
//!   ACKs that deliver a position those of one group: the group the position was ordered
//!   in. A node that joined by state transfer starts its epoch count at its view's; a
//!   change of a later epoch cannot lie below the view's own change (it was proposed after
//!   that change was delivered, so after every position below it was fixed), so all nodes
//!   stop at the same position. The simulator adds and removes nodes during loss, crashes
//!   and partitions and the checker holds every run to UTO1-4 and FIFO.
//!
//! Together: all deliveries at a position in one view agree (I2, I3), and every view's
//! log extends the prefixes delivered in earlier views (I5), so a position delivered anywhere
//! holds the same message everywhere (UTO3); each node delivers positions in increasing
//! order once (UTO4; a message is appended once per sender number, I1), and the message at
//! a position is one some sender broadcast. Liveness (UTO1, UTO2) needs what consensus
//! needs: eventually a majority of the receivers up, connected and not suspected, for long
//! enough to finish a view change; then the fast path resumes, retransmission fills every
//! loss and the leader aligns every divergence. The checker ([`check`]) tests all of this
//! over the simulator's histories ([`sim`]), with loss, reordering, crashes, restarts and
//! partitions.
//!
//! # Packet layout
//!
//! Every datagram is one packet: a fixed 28-byte header, big-endian, then the body.
//!
//! ```text
//! offset size field
//!  0      2   magic        0x544F ("TO")
//!  2      1   version      6; checked first, so a later version may change all that follows
//!  3      1   kind         1 DATA, 2 ACK, 3 NACK, 4 HEARTBEAT, 5 ENTRIES,
//!                          6 DO-VIEW-CHANGE, 7 START-VIEW, 8 MISSING, 9 FETCH, 10 LOG-PART,
//!                          11 GROUP
//!  4      2   from         the sending node
//!  6      4   incarnation  of the sending node
//! 10      8   view         the sender's view (or the view it is changing to)
//! 18      1   status       1 normal, 2 changing view, 3 joining, 4 sender only
//! 19      1   epoch        low byte of the newest group epoch the sender knows
//! 20      4   checksum     CRC32C of the whole packet with this field taken as zero
//! 24      4   body_len     bytes after the header; the packet is exactly 28 + body_len
//! 28      -   body
//! ```
//!
//! Bodies (counts `u16` unless said, lengths `u32`):
//!
//! ```text
//! ack        len u64, hash u64, commit u64, members u64 (bit per node),
//!            sent u64 (messages its node sent before this ACK, in this incarnation),
//!            n, n x (node u16, incarnation u32, delivered u64, held u64)
//! group      epoch u32, senders u64, receivers u64 (not 0), previous receivers u64 (not 0)
//! DATA       has_ack u8 (0|1), [ack], n, n x (seq u64, len, bytes)
//!            (a message's first byte: 0 the application's bytes follow, 1 a group change:
//!            epoch u32, node u16, role u8 (bit 0 sender, bit 1 receiver))
//! ACK        ack
//! NACK       node u16, incarnation u32, from u64, to u64 (from < to)
//! HEARTBEAT  empty
//! ENTRIES    from u64, prev_hash u64, n u32 runs of one sender's consecutive messages,
//!            n x (node u16, incarnation u32, seq u64, count u16 (>= 1),
//!                 count x (len, bytes)) (len u32::MAX: no bytes, the member holds them)
//! entries    n u32, n x (node u16, incarnation u32, seq u64, len, bytes)
//! part       start u64, start_hash u64, n, n x (node u16, incarnation u32, count u64),
//!            end u64, end_hash u64, first u64 (start <= first), entries (first + n <= end)
//! DO-VIEW-CHANGE  last_normal u64 (u64::MAX: none), commit u64, group, part
//! START-VIEW      members u64, commit u64, group, part
//! MISSING    from u64, to u64 (from < to; positions lacking of the header view's message)
//! FETCH      start u64, end u64, from u64, to u64 (start <= from < to <= end: the image
//!            start..end of your log, of which I lack from..to)
//! LOG-PART   part (of the image start..end a FETCH asked for)
//! GROUP      group (the newest the sender knows)
//! ```
//!
//! [`packet::decode`] never panics and refuses anything truncated, with trailing bytes, of
//! another magic or version, with a wrong checksum, over [`packet::PACKET_BYTES_MAX`], or with
//! a field out of range (a count that the remaining bytes cannot hold is refused before any
//! allocation).
//!
//! # Limits
//!
//! Every queue has a bound: `send_queue_messages_max` proposals waiting, `window_packets`
//! in flight per sender, what those can carry held out of order per sender, [`ACK_HISTORY_MAX`] ACKs
//! remembered per member, ENTRIES and view-change parts of at most `repair_bytes_max` bytes
//! per packet and [`REPAIR_PACKETS_MAX`] packets per repair round or MISSING answered,
//! 4,096 parts kept per view-change message being put together, at most
//! [`GROUP_NODES_MAX`] nodes; logs keep positions until every member delivered them, and at
//! most `log_retain_entries` more; a member fetches at most [`FETCH_POSITIONS_MAX`]
//! positions, asking every other member at most four times.

pub mod check;
pub mod log;
mod node;
pub mod packet;
mod parts;
pub mod rtt;
pub mod sim;

pub use node::{Node, Stats, FETCH_POSITIONS_MAX};

use bytes::Bytes;

/// Microseconds since an arbitrary origin.
pub type Micros = u64;

/// Most nodes in a group (members travel as a 64-bit set).
pub const GROUP_NODES_MAX: usize = 64;
/// ACKs of one member remembered until the local log reaches their length.
pub const ACK_HISTORY_MAX: usize = 64;
/// ENTRIES packets the leader sends one member per repair round (each at most
/// `repair_bytes_max` of messages), and parts of a view-change message sent per MISSING.
pub const REPAIR_PACKETS_MAX: usize = 16;

/// A sender's DATA packets whose messages may be undelivered at once, in windows: a hole
/// in one member's log stops delivery, not the network, for that long.
pub const RETAINED_WINDOWS: usize = 8;

/// A node of the group: `0..GROUP_NODES_MAX`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u16);

/// A sender: a node in one incarnation (a restarted node numbers its messages anew).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SenderId {
    /// The node.
    pub node: NodeId,
    /// Its incarnation.
    pub incarnation: u32,
}

/// A message's identity: its sender and its number in the sender's FIFO order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgId {
    /// Who sent it.
    pub sender: SenderId,
    /// Its sequence number, from 0 in each incarnation.
    pub seq: u64,
}

/// A node's status, carried in every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// A member of the view, on the fast path.
    Normal = 1,
    /// Changing to the view named.
    ViewChange = 2,
    /// A receiver that is not a member (excluded or restarted) and asks to join.
    Joining = 3,
    /// A node that only sends.
    Sender = 4,
}

impl Status {
    /// The status a byte encodes.
    pub fn from_byte(byte: u8) -> Option<Status> {
        Some(match byte {
            1 => Status::Normal,
            2 => Status::ViewChange,
            3 => Status::Joining,
            4 => Status::Sender,
            _ => return None,
        })
    }
}

/// What a node does in the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    /// It broadcasts messages.
    pub sender: bool,
    /// It orders and delivers messages.
    pub receiver: bool,
}

/// The known group: node `i` has role `roles[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// One role per node id.
    pub roles: Vec<Role>,
}

impl Group {
    /// `n` nodes, each a sender and a receiver.
    pub fn all_to_all(n: usize) -> Group {
        Group {
            roles: vec![
                Role {
                    sender: true,
                    receiver: true
                };
                n
            ],
        }
    }

    /// `senders` nodes that only send, then `receivers` that only receive.
    pub fn disjoint(senders: usize, receivers: usize) -> Group {
        let mut roles = vec![
            Role {
                sender: true,
                receiver: false
            };
            senders
        ];
        roles.extend(std::iter::repeat_n(
            Role {
                sender: false,
                receiver: true,
            },
            receivers,
        ));
        Group { roles }
    }

    /// The receivers, in id order.
    pub fn receivers(&self) -> Vec<NodeId> {
        (0..self.roles.len())
            .filter(|&i| self.roles[i].receiver)
            .map(|i| NodeId(i as u16))
            .collect()
    }

    /// The role of `node`, if it is in the group.
    pub fn role(&self, node: NodeId) -> Option<Role> {
        self.roles.get(node.0 as usize).copied()
    }

    /// Receivers that make a majority.
    pub fn majority(&self) -> usize {
        self.receivers().len() / 2 + 1
    }

    /// The leader of `view`.
    pub fn leader(&self, view: u64) -> NodeId {
        let receivers = self.receivers();
        receivers[(view % receivers.len() as u64) as usize]
    }

    /// The senders, one bit per node id.
    pub fn senders_mask(&self) -> u64 {
        mask(self.roles.iter().map(|role| role.sender))
    }

    /// The receivers, one bit per node id.
    pub fn receivers_mask(&self) -> u64 {
        mask(self.roles.iter().map(|role| role.receiver))
    }

    /// The group whose senders and receivers are the bits set in `senders` and `receivers`
    /// (node ids past the highest bit set are not in it).
    pub fn from_masks(senders: u64, receivers: u64) -> Group {
        let nodes = 64 - (senders | receivers).leading_zeros() as usize;
        Group {
            roles: (0..nodes)
                .map(|i| Role {
                    sender: senders & (1 << i) != 0,
                    receiver: receivers & (1 << i) != 0,
                })
                .collect(),
        }
    }
}

fn mask(bits: impl Iterator<Item = bool>) -> u64 {
    bits.enumerate()
        .filter(|(_, set)| *set)
        .fold(0, |mask, (i, _)| mask | 1 << i)
}

/// A group as the order knows it: the initial group is epoch 0, and every group change
/// UTO-delivered makes the next. A view runs one group: its leader, members and failure
/// detection are that group's; a view change needs a majority of this group's receivers
/// and of the previous group's (the joint quorum that makes a change of one receiver at a
/// time safe, see the crate docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupRecord {
    /// Group changes applied since the initial group.
    pub epoch: u32,
    /// Senders, one bit per node id.
    pub senders: u64,
    /// Receivers, one bit per node id (never empty).
    pub receivers: u64,
    /// The receivers of the group before this one (epoch 0: its own).
    pub previous_receivers: u64,
}

impl GroupRecord {
    /// The initial group (epoch 0).
    pub fn initial(group: &Group) -> GroupRecord {
        let receivers = group.receivers_mask();
        GroupRecord {
            epoch: 0,
            senders: group.senders_mask(),
            receivers,
            previous_receivers: receivers,
        }
    }

    /// The group as roles.
    pub fn group(&self) -> Group {
        Group::from_masks(self.senders, self.receivers)
    }

    /// The next group: `change` applied, if it is the change of the next epoch and leaves
    /// at least one receiver; `None` otherwise (the change is delivered and ignored).
    pub fn apply(&self, change: &GroupChange) -> Option<GroupRecord> {
        let node = usize::from(change.node.0);
        if change.epoch != self.epoch.checked_add(1)? || node >= GROUP_NODES_MAX {
            return None;
        }
        let bit = 1u64 << node;
        let set = |mask: u64, on: bool| if on { mask | bit } else { mask & !bit };
        let receivers = set(self.receivers, change.role.receiver);
        (receivers != 0).then_some(GroupRecord {
            epoch: change.epoch,
            senders: set(self.senders, change.role.sender),
            receivers,
            previous_receivers: self.receivers,
        })
    }
}

/// A change of the group, proposed as a message ([`Node::propose_group_change`]): from
/// `epoch` on, `node` has `role` (no role: removed). It takes effect where it is
/// UTO-delivered, if `epoch` is one past the group's epoch there; one change changes one
/// node, so at most one receiver, which is what keeps majorities of the old and the new
/// group intersecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupChange {
    /// The epoch this change makes.
    pub epoch: u32,
    /// The node added, changed or removed.
    pub node: NodeId,
    /// Its role from then on.
    pub role: Role,
}

/// First byte of every message in a log: an application message.
pub(crate) const MESSAGE_APPLICATION: u8 = 0;
/// First byte of a group change.
pub(crate) const MESSAGE_GROUP_CHANGE: u8 = 1;
/// Bytes of an encoded group change: kind, epoch u32, node u16, role u8.
const GROUP_CHANGE_LEN: usize = 8;

impl GroupChange {
    /// The message bytes, as carried in the log.
    pub(crate) fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(GROUP_CHANGE_LEN);
        out.push(MESSAGE_GROUP_CHANGE);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.node.0.to_be_bytes());
        out.push(u8::from(self.role.sender) | u8::from(self.role.receiver) << 1);
        Bytes::from(out)
    }

    /// The change a log message holds; `None` if it is not one (another kind, or
    /// malformed: delivered as nothing).
    pub(crate) fn decode(message: &[u8]) -> Option<GroupChange> {
        if message.len() != GROUP_CHANGE_LEN || message[0] != MESSAGE_GROUP_CHANGE {
            return None;
        }
        let roles = message[7];
        (roles <= 3).then(|| GroupChange {
            epoch: u32::from_be_bytes(message[1..5].try_into().expect("4 bytes")),
            node: NodeId(u16::from_be_bytes(
                message[5..7].try_into().expect("2 bytes"),
            )),
            role: Role {
                sender: roles & 1 != 0,
                receiver: roles & 2 != 0,
            },
        })
    }
}

/// Why a [`Group`] or [`Config`] cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No receiver, or more than [`GROUP_NODES_MAX`] nodes.
    #[error("a group needs 1..={GROUP_NODES_MAX} nodes and at least one receiver")]
    Group,
    /// `mtu_bytes` cannot hold a header, an ACK and a message byte.
    #[error("mtu_bytes {0} is too small")]
    Mtu(usize),
    /// A window, queue, threshold or interval is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// `suspect_after_us` is not above `heartbeat_interval_us`.
    #[error("suspect_after_us must exceed heartbeat_interval_us")]
    Suspect,
    /// `window_packets_min` is zero or above `window_packets`.
    #[error("window_packets_min must be within 1..=window_packets")]
    WindowFloor,
}

/// A node's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The link MTU (1500, or 9000 for jumbo frames); a data packet is at most this minus
    /// the 28 bytes of IPv4 and UDP headers.
    pub mtu_bytes: usize,
    /// Pack the messages that flow control deferred into full packets (section 3.2.1);
    /// `false`: one message per packet.
    pub aggregate: bool,
    /// Own DATA packets whose messages may be unacked by some member at once (local flow
    /// control); without aggregation, one message each.
    pub window_packets: u32,
    /// The window's floor under congestion. The sequencer link's queue is finite (a
    /// switch's port buffer): when the senders' windows together exceed it, packets are
    /// dropped there, every receiver misses them, and each costs a retransmission and a
    /// pause at every receiver. So a node halves its window (not below this) when an own
    /// packet did not come back through the network, at most once a round trip, and
    /// grows it by one packet per window of own packets back, up to `window_packets`
    /// (TCP's additive increase, multiplicative decrease). `window_packets`: a fixed
    /// window.
    pub window_packets_min: u32,
    /// Proposals that may wait for the window.
    pub send_queue_messages_max: usize,
    /// ACK aggregation: appends per ACK.
    pub ack_every_messages: u32,
    /// An owed ACK is sent at most this late when the sequencer link's queue is empty (and
    /// at once if the node is idle, see `ack_at_once_when_idle`).
    pub ack_delay_us: u64,
    /// Under load an owed ACK waits, besides `ack_delay_us`, the sequencer link's queue
    /// (as the node's own broadcasts measure it) divided by this, at most an eighth of
    /// `retransmit_after_us`, so that one ACK covers several DATA packets; 0: never.
    pub ack_queue_divisor: u64,
    /// An idle receiver (its last ACK packet a delay ago, no queue on the sequencer link
    /// worth waiting a share of) sends an owed ACK at once rather than `ack_delay_us`
    /// later: a lone message is UTO-delivered a round trip after it is sent, not a round
    /// trip and the delay. `false`: every ACK waits the delay (as before session 14).
    pub ack_at_once_when_idle: bool,
    /// A message unacked this long is sent again (the tail: NACKs and the leader's repairs,
    /// paced by the measured round trip, recover loss sooner); a quarter of it bounds that
    /// round trip from above. Where twice the time members took to hold the sender's
    /// messages lately is longer (queues under load), that, up to 8 times this.
    pub retransmit_after_us: u64,
    /// The round trip assumed before the first measurement, and its floor: NACKs, answers
    /// to them and repairs are paced by the measured round trip, never faster than this.
    pub rtt_floor_us: u64,
    /// Read leases ([`Node::read_lease_ends`]): a member tells its application until when
    /// it may answer reads from its own state, and no node enters a view that leaves out a
    /// node it acknowledged messages of within `suspect_after_us` (a restarted node: within
    /// `suspect_after_us` of its start). Off by default, for what it costs: with it, a view
    /// change that leaves out a node heard lately waits up to `suspect_after_us` longer.
    pub read_leases: bool,
    /// A node silent this long sends a heartbeat.
    pub heartbeat_interval_us: u64,
    /// A member silent this long is suspected.
    pub suspect_after_us: u64,
    /// A view change unfinished this long (plus up to as much again at random) moves on.
    pub view_change_timeout_us: u64,
    /// Delivered positions kept past what every member delivered, for stale members.
    pub log_retain_entries: u64,
    /// Bytes of messages (with 18 bytes of identity each) per ENTRIES packet and per part of
    /// a view-change message; the default keeps a packet within one UDP datagram (65,507
    /// bytes).
    pub repair_bytes_max: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            mtu_bytes: 1500,
            aggregate: true,
            window_packets: 64,
            window_packets_min: 2,
            send_queue_messages_max: 4096,
            ack_every_messages: 4,
            ack_delay_us: 100,
            ack_queue_divisor: 8,
            ack_at_once_when_idle: true,
            retransmit_after_us: 2_000,
            rtt_floor_us: 50,
            read_leases: false,
            heartbeat_interval_us: 1_000,
            suspect_after_us: 10_000,
            view_change_timeout_us: 20_000,
            log_retain_entries: 1 << 16,
            repair_bytes_max: 60 << 10,
        }
    }
}

impl Config {
    /// The settings of the lab and of the examples and tests that model it: jumbo packets
    /// (9000 bytes; loopback's MTU is 64 KiB), a window of 16 of them, one ACK per 64
    /// messages or 20 us, and failure detection slow enough that a node starved of a shared
    /// CPU for tens of milliseconds is not suspected (500 ms; callers that test view changes
    /// shorten it).
    pub fn jumbo() -> Config {
        Config {
            mtu_bytes: 9000,
            aggregate: true,
            window_packets: 16,
            ack_every_messages: 64,
            ack_delay_us: 20,
            retransmit_after_us: 50_000,
            heartbeat_interval_us: 5_000,
            suspect_after_us: 500_000,
            view_change_timeout_us: 200_000,
            send_queue_messages_max: 1 << 14,
            ..Config::default()
        }
    }

    /// Bytes of a data packet (the MTU minus IPv4 and UDP headers).
    pub fn packet_bytes_max(&self) -> usize {
        self.mtu_bytes.saturating_sub(28)
    }

    /// The largest message [`Node::propose`] accepts: one that fits a data packet alone,
    /// without a piggybacked ACK, with the byte that tells an application message from a
    /// group change.
    pub fn message_bytes_max(&self) -> usize {
        self.packet_bytes_max().saturating_sub(
            packet::HEADER_LEN + packet::DATA_FIXED_LEN + packet::MESSAGE_OVERHEAD + 1,
        )
    }

    /// Checks the settings; [`Node::new`] panics on what this refuses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.message_bytes_max() == 0 {
            return Err(ConfigError::Mtu(self.mtu_bytes));
        }
        for (value, name) in [
            (self.window_packets as u64, "window_packets"),
            (
                self.send_queue_messages_max as u64,
                "send_queue_messages_max",
            ),
            (self.ack_every_messages as u64, "ack_every_messages"),
            (self.retransmit_after_us, "retransmit_after_us"),
            (self.rtt_floor_us, "rtt_floor_us"),
            (self.heartbeat_interval_us, "heartbeat_interval_us"),
            (self.view_change_timeout_us, "view_change_timeout_us"),
            (self.repair_bytes_max as u64, "repair_bytes_max"),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.window_packets_min == 0 || self.window_packets_min > self.window_packets {
            return Err(ConfigError::WindowFloor);
        }
        if self.suspect_after_us <= self.heartbeat_interval_us {
            return Err(ConfigError::Suspect);
        }
        Ok(())
    }
}

/// How a node begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// With the group: a member of view 0 with an empty log.
    Initial,
    /// After a crash, with nothing remembered: joins the current view.
    Restarted,
    /// A node being added: it holds nothing, learns the current group from the others and
    /// joins once a delivered group change made it a receiver (the group given to
    /// [`Node::new`] need not contain it).
    Added,
}

/// Where a packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// Every node, through the sequencer link (multicast, or unicast fan-out).
    All,
    /// One node.
    Node(NodeId),
}

/// A packet to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where.
    pub destination: Destination,
    /// The encoded packet.
    pub contents: Vec<u8>,
}

/// What a node tells its application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// PO delivery: `message` holds `position` in this node's preliminary order. It may be
    /// revoked ([`Event::Revoked`]) until delivered in UTO.
    Optimistic {
        /// The position.
        position: u64,
        /// The message's identity.
        id: MsgId,
        /// Its bytes.
        message: Bytes,
    },
    /// The preliminary order from `from` on was replaced (the leader's order took over or a
    /// view change); the positions will be reported again.
    Revoked {
        /// First position revoked.
        from: u64,
    },
    /// UTO delivery: final, the same at every node, in increasing positions.
    Deliver {
        /// The position.
        position: u64,
        /// The message's identity.
        id: MsgId,
        /// Its bytes.
        message: Bytes,
    },
    /// This node is a normal member of `view`.
    View {
        /// The view number.
        view: u64,
        /// Its members.
        members: Vec<NodeId>,
        /// Its leader.
        leader: NodeId,
    },
    /// This incarnation delivers from `position` on (the earlier positions are state the
    /// application must get elsewhere).
    Joined {
        /// First position it will deliver.
        position: u64,
    },
    /// A member was silent for `suspect_after_us`.
    Suspected {
        /// The member.
        node: NodeId,
    },
    /// UTO delivery of a group change at `position` (it holds the place of a message). It
    /// takes effect there if its epoch is one past the group's there
    /// ([`GroupRecord::apply`]: an application that keeps the group in its state applies
    /// it the same way); the next view runs the new group ([`Event::Group`]).
    GroupChange {
        /// The position.
        position: u64,
        /// The message's identity.
        id: MsgId,
        /// The change.
        change: GroupChange,
        /// Its bytes as proposed (for a checker).
        message: Bytes,
    },
    /// The newest group this node knows changed (a group change delivered, or learnt from
    /// a peer or a START-VIEW).
    Group(GroupRecord),
    /// This node is no longer a receiver of the group: it takes no further part.
    Removed,
    /// A view started past positions this node had not delivered and no member it asked
    /// retained (or a view change cut the fetch short): the application must transfer
    /// state (only if `log_retain_entries` was too small).
    Gap {
        /// First position this node did not deliver.
        from: u64,
        /// The position it delivers from now on.
        to: u64,
    },
}

/// Why [`Node::propose`] refused a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This node is not a sender in the group.
    #[error("this node is not a sender")]
    NotSender,
    /// Larger than [`Config::message_bytes_max`].
    #[error("message of {0} bytes does not fit a packet")]
    TooLarge(usize),
    /// `send_queue_messages_max` proposals already wait.
    #[error("send queue full")]
    QueueFull,
    /// A group change names a node id of [`GROUP_NODES_MAX`] or more.
    #[error("node id {0} is out of range")]
    NodeId(u16),
    /// A group change would leave the group without a receiver.
    #[error("the group would have no receiver")]
    NoReceiver,
}
