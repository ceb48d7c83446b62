//! Every copied packet the snooping listener could be handed: arbitrary bytes as an
//! IP packet, its DNS message as a query and as an answer (so the matching and CNAME
//! following run on hostile input too), and the raw bytes as a DNS message directly.
#![no_main]

use std::time::Instant;

use egressd::dns::snoop::{Snooper, dns_message, name_matches, parse_packet};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    let mut snooper = Snooper::new();
    if let Ok(packet) = parse_packet(data) {
        let reply = egressd::dns::snoop::Packet {
            src: packet.dst,
            dst: packet.src,
            sport: packet.dport,
            dport: packet.sport,
            ..packet.clone()
        };
        // The bytes as a query, then (after a SYN-ACK for TCP) as the answer.
        let _ = snooper.query(&packet, now);
        let _ = snooper.answer(&egressd::dns::snoop::Packet { syn: true, payload: &[], ..reply.clone() }, now);
        let _ = snooper.answer(&egressd::dns::snoop::Packet { seq: reply.seq.wrapping_add(1), ..reply.clone() }, now);
        if let Ok(message) = dns_message(&packet) {
            // Register the message as a query, then hand it back as the answer, so
            // matching and CNAME following run on whatever the input holds.
            let mut query = message.clone();
            query.metadata.message_type = hickory_proto::op::MessageType::Query;
            let _ = snooper.query_message(&packet, &query, now);
            let mut message = message;
            message.metadata.message_type = hickory_proto::op::MessageType::Response;
            if let Ok(learned) = snooper.answer_message(&reply, &message, now) {
                for l in learned {
                    for n in &l.names {
                        let _ = name_matches("example.com", true, n);
                    }
                }
            }
        }
    }
});
