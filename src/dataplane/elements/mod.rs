//! Set and map elements in-process over nf_tables netlink: one batch (`BATCH_BEGIN`,
//! `DELSETELEM`/`NEWSETELEM` messages, `BATCH_END`), no `nft` process.
//!
//! * [`ElementWriter::add`]: the fast path of DNS snooping, where the time from an
//!   answer to its address being in the set is the race a pod's first packet runs
//!   against; starting an `nft` process costs ~5 ms, this ~0.1 ms. Many elements
//!   (putting back thousands of learned addresses after a full replace) are split into
//!   messages and transactions the kernel takes.
//! * [`ElementWriter::apply`]: the steady state of the nftables driver — an
//!   [`ElementDelta`] (pods, DNS answers, EgressIP members, the destinations of merged
//!   firewall runs as ranges) as one transaction however
//!   large, with the socket's send buffer raised to hold it (`SO_SNDBUFFORCE`). An
//!   `nft` process would first read the whole table into its cache (tens of ms at 100k
//!   rules, far more with large interval sets).
//!
//! Adding an element that exists restarts its timeout (no `NLM_F_EXCL`), the same as
//! `nft add element`.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla,
};
use netlink_packet_netfilter::nftables::{
    DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute, NfTablesMessage, RuleAttribute,
    RuleMessage, SetElementAttribute, SetElementList, SetElementMessage, Verdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::nft::delta::ElementDelta;
use crate::nft::{Key, Slot, Value};

mod encode;
mod read;

use encode::{encode_element, key_bytes};
pub(crate) use read::RuleRead;

const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// Transactions this process committed over netlink (each bumps the ruleset's
/// generation id by one): what [`crate::dataplane::drift`] subtracts when it checks the
/// generation after a full replace it did not watch.
static OWN_COMMITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many transactions this process has committed over netlink so far.
pub(crate) fn own_commits() -> u64 {
    OWN_COMMITS.load(std::sync::atomic::Ordering::SeqCst)
}

/// One element to add: its slot of a tagged set, address, timeout.
pub type Element = (Slot, IpAddr, Duration);

/// A netlink socket to nf_tables for element additions.
pub struct ElementWriter {
    socket: Socket,
    table: String,
    seq: u32,
    buf: Vec<u8>,
    /// The send buffer size last asked for (0: the default).
    send_buffer: usize,
    /// Bytes per transaction of a table created in stages.
    stage_bytes: usize,
}

impl ElementWriter {
    /// Open the socket (in the caller's network namespace) for the `inet` table `table`.
    pub fn open(table: &str) -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // A reply that never comes fails the call instead of blocking its caller.
        socket2::SockRef::from(&socket).set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        Ok(Self {
            socket,
            table: table.to_string(),
            seq: 0,
            buf: vec![0; 1 << 18],
            send_buffer: 0,
            stage_bytes: STAGE_BYTES,
        })
    }

    /// Apply `delta` (deletions, then additions) as one transaction: all of it or, on
    /// an error (an element to delete that is not there, a chain a jump names that is
    /// not), nothing. The send buffer grows to hold the batch.
    pub fn apply(&mut self, delta: &ElementDelta) -> io::Result<()> {
        let mut batch: Vec<u8> = Vec::new();
        let mut waiting: Vec<u32> = Vec::new();
        for (delete, lists) in [(true, &delta.delete), (false, &delta.add)] {
            self.element_messages(lists, delete, false, &mut batch, &mut waiting);
        }
        if batch.is_empty() {
            return Ok(());
        }
        // The batch is one datagram: the kernel refuses it (EMSGSIZE) beyond the send
        // buffer.
        self.send_buffer_for(batch.len())?;
        self.send_batch(batch, waiting)
    }

    /// Append the messages that delete or add the elements of `lists` to `batch` (with
    /// `NLM_F_ACK`, their sequence numbers to `waiting`, unless `quiet`).
    fn element_messages(
        &mut self,
        lists: &[crate::nft::delta::SetElements],
        delete: bool,
        quiet: bool,
        batch: &mut Vec<u8>,
        waiting: &mut Vec<u32>,
    ) {
        for list in lists {
            self.set_element_messages(list, None, delete, quiet, batch, waiting);
        }
    }

    /// The messages of one set's elements (see [`Self::element_messages`]). With `id`
    /// (a set created earlier in the same transaction) the set is named by its
    /// transaction id only: the kernel then finds it among the transaction's new sets
    /// from the newest back — one step right after its `NEWSET` — instead of comparing
    /// its name with every set of the table (the name scan was ~50 ms of a full replace
    /// with 2,000 sets).
    fn set_element_messages(
        &mut self,
        list: &crate::nft::delta::SetElements,
        id: Option<u32>,
        delete: bool,
        quiet: bool,
        batch: &mut Vec<u8>,
        waiting: &mut Vec<u32>,
    ) {
        use crate::nft::wire::{nest, put_str};
        const NEWSETELEM: u16 = 12;
        const DELSETELEM: u16 = 14;
        // A message's element list is one attribute with a 16-bit length: a message is
        // closed before its list would pass this.
        const LIST_BYTES: usize = 60_000;
        let ack = if quiet { 0 } else { NLM_F_ACK };
        let (kind, flags) =
            if delete { (DELSETELEM, NLM_F_REQUEST | ack) } else { (NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | ack) };
        // Sized for the list (a guard refresh writes a few elements four times a second:
        // a 60 KB buffer each time made glibc consolidate its free lists every time).
        let mut elements: Vec<u8> = Vec::with_capacity((list.elements.len() * 96).min(LIST_BYTES + 1024));
        let mut items = list.elements.iter().peekable();
        while items.peek().is_some() {
            elements.clear();
            while elements.len() < LIST_BYTES
                && let Some((key, value)) = items.next()
            {
                encode_element(&mut elements, key, value, !delete);
            }
            let mut body = Vec::with_capacity(elements.len() + 64);
            put_str(&mut body, 1, &self.table);
            match id {
                Some(id) => crate::nft::wire::put_u32(&mut body, 4, id),
                None => put_str(&mut body, 2, &list.set),
            }
            nest(&mut body, 3, |o| o.extend_from_slice(&elements));
            self.raw_message_into(batch, kind, flags, &body);
            if !quiet {
                waiting.push(self.seq);
            }
        }
    }

    /// Raise the send buffer to hold a batch of `len` bytes (with room for the batch
    /// markers; the kernel doubles it). Forcing needs CAP_NET_ADMIN (which the agent
    /// has); else up to wmem_max.
    fn send_buffer_for(&mut self, len: usize) -> io::Result<()> {
        let needed = len + 4096;
        if needed > self.send_buffer {
            if nix::sys::socket::setsockopt(&self.socket, nix::sys::socket::sockopt::SndBufForce, &needed).is_err() {
                socket2::SockRef::from(&self.socket).set_send_buffer_size(needed)?;
            }
            self.send_buffer = needed;
        }
        Ok(())
    }

    /// Replace the kernel's table of this name with `table`, without `nft`:
    /// [`crate::nft::wire::replace_messages`], then every element, and the elements
    /// `kept` (what DNS snooping learned: the new sets hold them from the transaction
    /// on, no packet finds them missing). `Unsupported` (nothing left changed) when a
    /// rule or set is outside what the netlink path writes; the kernel's error on the
    /// message it refused otherwise, naming that message.
    ///
    /// When the kernel has no table of this name, the table is created in stages
    /// ([`Self::create_in_stages`]): the transaction is not held whole, which was the
    /// agent's peak memory at its first sync. A table that exists is replaced in one
    /// transaction (packets meet the old table or the new one, never a mix).
    pub fn replace(&mut self, table: &crate::nft::Table, kept: &[Element]) -> io::Result<()> {
        let empty = crate::nft::Table::new(table.name.as_str());
        let mut elements = crate::nft::delta::ElementDelta::of_sets(&crate::nft::Comparison::of(&empty, table))
            .ok_or_else(|| unsupported(crate::nft::wire::WireError::Element))?;
        elements.add.extend(by_set(kept));
        // Every set is created by this transaction: its elements follow its NEWSET.
        let (fresh, rest) = fresh_and_rest(&elements, |name| table.sets.contains_key(name));
        if !self.table_exists()? {
            match self.create_in_stages(table, &fresh, &rest) {
                // Created meanwhile by someone else: replaced as one transaction below.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                created => return created,
            }
        }
        // The messages go into the transaction's buffer as they are made: a replace of
        // 100k rules never holds them all beside it.
        let mut tx = self.begin();
        let mut sink = |m: crate::nft::wire::Message| self.push(&mut tx, &fresh, &m, 0);
        crate::nft::wire::replace_messages(table, &mut sink).map_err(unsupported)?;
        self.push_elements(&mut tx, &elements.delete, &rest);
        self.commit(&table.name, tx)
    }

    /// Whether the kernel has this writer's table (a `GETTABLE`).
    pub fn table_exists(&mut self) -> io::Result<bool> {
        use netlink_packet_netfilter::nftables::{TableAttribute, TableMessage};
        let msg =
            NfTablesMessage::GetTable(TableMessage { attributes: vec![TableAttribute::Name(self.table.clone())] });
        let out = self.message(NLM_F_REQUEST | NLM_F_ACK, msg, 0);
        self.socket.send(&out, 0)?;
        let seq = self.seq;
        crate::dataplane::recv_until(&self.socket, &mut self.buf, |msg| match msg.payload {
            NetlinkPayload::Error(e) if msg.header.sequence_number == seq => Some(crate::dataplane::ack(e.code)),
            _ => None,
        })
    }

    /// How many bytes of messages a table created in stages puts in one transaction
    /// before it commits them and goes on in the next ([`STAGE_BYTES`] by default).
    pub fn with_stage_bytes(mut self, bytes: usize) -> Self {
        self.stage_bytes = bytes;
        self
    }

    /// Create `table` (the kernel has none of this name) in several transactions of
    /// about [`Self::with_stage_bytes`] each: the first creates the table
    /// (`NLM_F_EXCL`: `AlreadyExists` when it exists after all, and nothing changed),
    /// its counters, sets with their elements (`fresh`), regular chains and maps; the
    /// regular chains' rules follow; the last transaction adds the base chains with
    /// their rules, then the elements `rest`. Nothing reaches a regular chain before
    /// that last one commits, so packets meet no policy or all of it. A table small
    /// enough is one transaction. On an error after a transaction committed, the
    /// partial table (egressd's own, created here, hooked nowhere) is deleted.
    fn create_in_stages(
        &mut self,
        table: &crate::nft::Table,
        fresh: &Fresh<'_>,
        rest: &[&crate::nft::delta::SetElements],
    ) -> io::Result<()> {
        use crate::nft::wire::{MSG_NEWTABLE, Part, creation_messages};
        let name = table.name.as_str();
        let mut staged = 0usize;
        let mut failed: Option<io::Error> = None;
        let mut tx = self.begin();
        let made = creation_messages(table, &mut |part, m| {
            if failed.is_some() {
                return;
            }
            let exclusive = if m.kind == MSG_NEWTABLE { netlink_packet_core::NLM_F_EXCL } else { 0 };
            self.push(&mut tx, fresh, &m, exclusive);
            if part == Part::Regular && m.kind == crate::nft::wire::MSG_NEWRULE && tx.buf.len() >= self.stage_bytes {
                let full = std::mem::replace(&mut tx, self.begin());
                match self.commit(name, full) {
                    Ok(()) => staged += 1,
                    Err(e) => failed = Some(e),
                }
            }
        });
        let outcome = match (made, failed) {
            (Err(e), _) => Err(unsupported(e)),
            (Ok(()), Some(e)) => Err(e),
            (Ok(()), None) => {
                self.push_elements(&mut tx, &[], rest);
                self.commit(name, tx)
            }
        };
        if outcome.is_err()
            && staged > 0
            && let Err(e) = self.delete_table()
        {
            tracing::warn!(table = name, error = %e, "the partly created table could not be deleted");
        }
        outcome
    }

    /// Delete this writer's table (one transaction).
    fn delete_table(&mut self) -> io::Result<()> {
        let mut body = Vec::new();
        crate::nft::wire::put_str(&mut body, 1, &self.table);
        let mut batch = Vec::new();
        self.raw_message_into(&mut batch, crate::nft::wire::MSG_DELTABLE, NLM_F_REQUEST | NLM_F_ACK, &body);
        let seq = self.seq;
        self.send_batch(batch, vec![seq])
    }

    /// Change the kernel's table from `c.old` (what it holds) into `c.new` in one
    /// transaction, without `nft`: the same steps as [`crate::nft::diff`]'s script
    /// (new chains and sets, changed rules, element changes, what is gone). A change
    /// only a full replace makes is sent as one ([`ElementWriter::replace`]).
    /// `Unsupported` (nothing sent) as there.
    pub fn apply_changes(&mut self, c: &crate::nft::Comparison<'_>) -> io::Result<()> {
        let Some((before, after)) = crate::nft::wire::delta_messages(c).map_err(unsupported)? else {
            return self.replace(c.new, &[]);
        };
        let elements = crate::nft::delta::ElementDelta::of_sets(c)
            .ok_or_else(|| unsupported(crate::nft::wire::WireError::Element))?;
        self.send_described(&c.new.name, &before, &elements, &after)
    }

    /// Send `before`, the element deletions and additions of `elements`, then `after`,
    /// as one transaction (of table `table`) and wait for its outcome; a refusal names
    /// the message the kernel refused.
    fn send_described(
        &mut self,
        table: &str,
        before: &[crate::nft::wire::Message],
        elements: &ElementDelta,
        after: &[crate::nft::wire::Message],
    ) -> io::Result<()> {
        // Elements added to sets this transaction creates follow their `NEWSET`, by id.
        let created: std::collections::BTreeSet<&str> =
            before.iter().chain(after).filter_map(|m| m.new_set.as_ref().map(|(name, _)| name.as_str())).collect();
        let (fresh, rest) = fresh_and_rest(elements, |name| created.contains(name));
        let mut tx = self.begin();
        for m in before {
            self.push(&mut tx, &fresh, m, 0);
        }
        self.push_elements(&mut tx, &elements.delete, &rest);
        for m in after {
            self.push(&mut tx, &fresh, m, 0);
        }
        self.commit(table, tx)
    }

    /// A transaction's buffer, opened with its `BatchBegin`.
    fn begin(&mut self) -> Transaction {
        let buf = self.message(NLM_F_REQUEST, ControlMessage::BatchBegin, NFNL_SUBSYS_NFTABLES);
        Transaction { buf, begin_seq: self.seq, what: Vec::new() }
    }

    /// Append `m` to `tx` (a set's `NEWSET` followed by its elements from `fresh`), with
    /// the netlink flags `extra` besides its own.
    fn push(&mut self, tx: &mut Transaction, fresh: &Fresh<'_>, m: &crate::nft::wire::Message, extra: u16) {
        let mut flags = NLM_F_REQUEST | extra;
        if m.create {
            flags |= NLM_F_CREATE;
        }
        if m.append {
            flags |= netlink_packet_core::NLM_F_APPEND;
        }
        self.raw_message_into(&mut tx.buf, m.kind, flags, &m.body);
        tx.what.push((self.seq, m.what.clone()));
        let Some((name, id)) = &m.new_set else { return };
        for list in fresh.get(name.as_str()).into_iter().flatten() {
            let first = self.seq.wrapping_add(1);
            self.set_element_messages(list, Some(*id), false, true, &mut tx.buf, &mut Vec::new());
            for seq in first..=self.seq {
                tx.what.push((seq, format!("adding elements to set {name}").into()));
            }
        }
    }

    /// Append the element deletions `delete`, then the additions `add` (to sets that
    /// exist before the transaction).
    fn push_elements(
        &mut self,
        tx: &mut Transaction,
        delete: &[crate::nft::delta::SetElements],
        add: &[&crate::nft::delta::SetElements],
    ) {
        for (delete, lists) in [(true, delete.iter().collect::<Vec<_>>()), (false, add.to_vec())] {
            let first = self.seq.wrapping_add(1);
            for list in lists {
                self.set_element_messages(list, None, delete, true, &mut tx.buf, &mut Vec::new());
            }
            for seq in first..=self.seq {
                let verb = if delete { "deleting" } else { "adding" };
                tx.what.push((seq, format!("{verb} elements").into()));
            }
        }
    }

    /// Close `tx` (of table `table`), send it and wait for its outcome; a refusal names
    /// the message the kernel refused.
    ///
    /// Only the last message asks for an acknowledgement: the kernel handles the whole
    /// batch within the `send`, and reports every refused message whatever its flags,
    /// so thousands of acknowledgements do not overflow the receive buffer.
    fn commit(&mut self, table: &str, tx: Transaction) -> io::Result<()> {
        use crate::nft::wire;
        let Transaction { mut buf, begin_seq, what } = tx;
        // The last message asks for the acknowledgement that ends the wait (a table
        // update that changes nothing).
        let mut body = Vec::new();
        wire::put_str(&mut body, 1, table);
        wire::put_u32(&mut body, 2, 0);
        self.raw_message_into(&mut buf, wire::MSG_NEWTABLE, NLM_F_REQUEST | NLM_F_ACK, &body);
        let last = self.seq;
        buf.extend(self.message(NLM_F_REQUEST, ControlMessage::BatchEnd, NFNL_SUBSYS_NFTABLES));
        self.send_buffer_for(buf.len())?;
        self.socket.send(&buf, 0)?;
        drop(buf);
        let mut error: Option<io::Error> = None;
        crate::dataplane::recv_until(&self.socket, &mut self.buf, |msg| {
            let NetlinkPayload::Error(e) = msg.payload else { return None };
            let seq = msg.header.sequence_number;
            if let Some(code) = e.code
                && error.is_none()
            {
                let os = io::Error::from_raw_os_error(-code.get());
                let name = what.iter().find(|(s, _)| *s == seq).map_or("the batch".to_string(), |(_, w)| w.to_string());
                error = Some(io::Error::new(os.kind(), format!("{name}: {os}")));
            }
            // The kernel answers the batch's first message instead when it could not
            // queue the errors (out of memory).
            (seq == last || seq == begin_seq).then_some(Ok(()))
        })?;
        if error.is_none() {
            OWN_COMMITS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        error.map_or(Ok(()), Err)
    }

    /// A message of nf_tables type `kind` (family `inet`) with the attributes `body`,
    /// appended to `out`.
    fn raw_message_into(&mut self, out: &mut Vec<u8>, kind: u16, flags: u16, body: &[u8]) {
        self.seq = self.seq.wrapping_add(1);
        let len = 16 + 4 + body.len();
        out.extend((len as u32).to_ne_bytes());
        out.extend(((NFNL_SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
        out.extend(flags.to_ne_bytes());
        out.extend(self.seq.to_ne_bytes());
        out.extend(0u32.to_ne_bytes());
        // nfgenmsg: family NFPROTO_INET, version 0, resource id 0.
        out.extend([1u8, 0, 0, 0]);
        out.extend(body);
    }

    fn message(
        &mut self,
        flags: u16,
        inner: impl Into<netlink_packet_netfilter::NetfilterMessageInner>,
        res: u16,
    ) -> Vec<u8> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let family =
            if res == NFNL_SUBSYS_NFTABLES { NetfilterProtoFamily::Unspec } else { NetfilterProtoFamily::Inet };
        let mut msg = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(NetfilterHeader::new(family, 0, res), inner)),
        );
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        out
    }

    /// Add `elements`: in one transaction when they fit ([`ELEMENTS_PER_MESSAGE`] per
    /// message, [`BATCH_BYTES`] per transaction), else in as many as needed. Replies
    /// are matched to messages by sequence number. On an error (an unknown set, a full
    /// set) the transaction it is in applies nothing, the others still apply, and the
    /// first error is returned.
    pub fn add(&mut self, elements: &[Element]) -> io::Result<()> {
        let mut first_error = None;
        let mut batch: Vec<u8> = Vec::new();
        let mut waiting: Vec<u32> = Vec::new();
        for crate::nft::delta::SetElements { set, elements: list } in by_set(elements) {
            for chunk in list.chunks(ELEMENTS_PER_MESSAGE) {
                // Room for one more message of at most 56 bytes per element?
                if !batch.is_empty()
                    && batch.len() + ELEMENTS_PER_MESSAGE * 56 > BATCH_BYTES
                    && let Err(e) = self.send_batch(std::mem::take(&mut batch), std::mem::take(&mut waiting))
                {
                    first_error.get_or_insert(e);
                }
                let list = crate::nft::delta::SetElements { set: set.clone(), elements: chunk.to_vec() };
                self.set_element_messages(&list, None, false, false, &mut batch, &mut waiting);
            }
        }
        if !batch.is_empty()
            && let Err(e) = self.send_batch(batch, waiting)
        {
            first_error.get_or_insert(e);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Send `messages` (element messages with sequence numbers `waiting`) as one
    /// transaction and wait for the reply to each.
    fn send_batch(&mut self, messages: Vec<u8>, mut waiting: Vec<u32>) -> io::Result<()> {
        let mut batch = self.message(NLM_F_REQUEST, ControlMessage::BatchBegin, NFNL_SUBSYS_NFTABLES);
        batch.extend(messages);
        batch.extend(self.message(NLM_F_REQUEST, ControlMessage::BatchEnd, NFNL_SUBSYS_NFTABLES));
        self.socket.send(&batch, 0)?;
        // The kernel answers every message with NLM_F_ACK, also when the transaction
        // fails (then with the error on the message that failed).
        let mut error = None;
        crate::dataplane::recv_until(&self.socket, &mut self.buf, |msg| {
            let NetlinkPayload::Error(e) = msg.payload else { return None };
            let at = waiting.iter().position(|s| *s == msg.header.sequence_number)?;
            waiting.swap_remove(at);
            if let Some(code) = e.code {
                error.get_or_insert(io::Error::from_raw_os_error(-code.get()));
            }
            waiting.is_empty().then_some(Ok(()))
        })?;
        if error.is_none() {
            OWN_COMMITS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        error.map_or(Ok(()), Err)
    }
}

/// A transaction being built: its messages in one buffer behind its `BatchBegin`, and
/// what each is (by sequence number, for the error that names a refused one).
struct Transaction {
    buf: Vec<u8>,
    begin_seq: u32,
    what: Vec<(u32, crate::nft::wire::What)>,
}

/// The element lists of sets a transaction creates, by set name: they follow the set's
/// `NEWSET` (by its id).
type Fresh<'e> = std::collections::BTreeMap<&'e str, Vec<&'e crate::nft::delta::SetElements>>;

/// `elements`' additions split into those of sets the transaction creates (`created`)
/// and the rest, in order.
fn fresh_and_rest<'e>(
    elements: &'e ElementDelta,
    created: impl Fn(&str) -> bool,
) -> (Fresh<'e>, Vec<&'e crate::nft::delta::SetElements>) {
    let mut fresh = Fresh::new();
    let mut rest = Vec::new();
    for list in &elements.add {
        if created(list.set.as_str()) {
            fresh.entry(list.set.as_str()).or_default().push(list);
        } else {
            rest.push(list);
        }
    }
    (fresh, rest)
}

/// `elements` as element lists, one per set (a key carries its slot's tag).
pub(crate) fn by_set(elements: &[Element]) -> Vec<crate::nft::delta::SetElements> {
    let mut by_set: std::collections::BTreeMap<&str, Vec<(Key, Value)>> = Default::default();
    for (slot, ip, timeout) in elements {
        by_set.entry(slot.set).or_default().push((slot.key(*ip), Value::Timeout(*timeout)));
    }
    by_set
        .into_iter()
        .map(|(set, elements)| crate::nft::delta::SetElements { set: set.to_string(), elements })
        .collect()
}

/// What the netlink path does not write, as an `Unsupported` error.
fn unsupported(what: crate::nft::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, what)
}

/// Bytes of messages per transaction when a table is created in stages
/// ([`ElementWriter::replace`]): the first sync's peak memory is about this beside the
/// compiled table, where one transaction of 100k rules held 63 MB (bench/FINDINGS.md
/// "2026-11-29 (seventh)"; 1 MiB cost no time measurably).
pub const STAGE_BYTES: usize = 1 << 20;

/// Most elements in one `NEWSETELEM` message: its element list is one netlink attribute
/// with a 16-bit length (a tagged IPv6 element with its timeout takes 52 bytes; 1,024 of
/// them 53 KB).
pub(crate) const ELEMENTS_PER_MESSAGE: usize = 1024;
/// Most bytes of element messages in one transaction (one `send`): well under the
/// socket's default send buffer (~212 KB), beyond which the send fails with EMSGSIZE.
pub(crate) const BATCH_BYTES: usize = 128 * 1024;
