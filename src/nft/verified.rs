//! Verified connections: the firewall's fast path for the packets of a connection after
//! its first.
//!
//! An allow rule of a namespace chain returns to the base chain (instead of accepting),
//! whose last rules write the policy's current *generation* into the connection's
//! conntrack mark (the bits of a mask, `--firewall-verified-mark-mask`; what falls
//! through a namespace chain, accepted by the policy, is marked too), and the base chain
//! accepts an established connection whose mark holds the current generation before the
//! pod map:
//!
//! ```text
//! set fw-epoch { type mark; elements = { 0x01000000 } }        # the current generation
//! chain firewall {
//!     …; ct state established ct mark and 0x03000000 @fw-epoch accept
//!     ip saddr vmap @fw-pods-v4; …; ip6 saddr vmap @fw-pods-v6
//!     ct mark and 0x00000000 or 0x01000000 @fw-epoch ct mark set ct mark and 0xfcffffff or 0x01000000 accept
//!     ct mark and 0x00000000 or 0x02000000 @fw-epoch ct mark set ct mark and 0xfcffffff or 0x02000000 accept
//!     …
//! }
//! ```
//!
//! (`ct mark and 0 or <v>` is the constant `<v>`: the one rule whose value is the
//! current generation marks.) The marking rules are in the base chain, not in a chain
//! every allow jumps to: the kernel re-validates the table through every jump when a
//! change adds one (a pod's map element), and a chain reached from a thousand namespace
//! chains was walked a thousand times (+1 ms per such change, measured).
//! Every change of the table moves the generation in the same transaction — an
//! element of `fw-epoch`, so the kernel re-validates nothing — and every established
//! connection's next packet walks the rules again, as OVN evaluates its ACLs on every
//! packet. Before a value is current again, conntrack entries still carrying it are
//! cleared ([`crate::dataplane::verified::Generations`]): an old verdict never passes
//! for a new one. The compile leaves `fw-epoch` empty (nothing is verified); the syncer
//! stamps the generation it applies.

use super::{Set, Table, Text};

/// The set holding the current generation's mark value.
pub const EPOCH_SET: &str = "fw-epoch";

/// The generation values a mask holds, shifted into it: 1 … 2^bits − 1 (0 is
/// "not verified").
pub fn values(mask: u32) -> impl Iterator<Item = u32> {
    let shift = mask.trailing_zeros();
    let count = mask.checked_shr(shift).unwrap_or(0);
    (1..=count).map(move |k| k << shift)
}

/// Check a verified-connections mask: 0 (off), or at least two contiguous bits (three
/// generations: the current, the one before it whose packets may still be in flight,
/// and the next, cleared beforehand) clear of `others` (EgressIP's conntrack mark bits).
pub fn check_mask(mask: u32, others: u32) -> Result<(), String> {
    if mask == 0 {
        return Ok(());
    }
    let shifted = mask >> mask.trailing_zeros();
    if shifted & shifted.wrapping_add(1) != 0 {
        return Err(format!("{mask:#010x}: the bits must be contiguous (e.g. 0x03000000)"));
    }
    if shifted < 3 {
        return Err(format!("{mask:#010x}: at least two bits are needed (three generations)"));
    }
    if mask & others != 0 {
        return Err(format!("{mask:#010x} overlaps the EgressIP mark bits {others:#010x}"));
    }
    Ok(())
}

/// The base chain's fast path: an established connection verified under the current
/// generation.
pub fn fast_path(mask: u32) -> String {
    format!("ct state established ct mark and {mask:#010x} @{EPOCH_SET} accept")
}

/// The base chain's last rules: one per generation value, marking the connection when
/// it is the current one.
pub fn marking_rules(mask: u32) -> Vec<String> {
    values(mask)
        .map(|v| {
            format!(
                "ct mark and 0x00000000 or {v:#010x} @{EPOCH_SET} ct mark set ct mark and {keep:#010x} or {v:#010x} accept",
                keep = !mask
            )
        })
        .collect()
}

/// Set `table`'s current generation (its only `fw-epoch` element) to `value`, or to
/// none; a table without the set is left alone.
pub fn stamp(table: &mut Table, value: Option<u32>) {
    let Some(set) = table.sets.get_mut(EPOCH_SET) else { return };
    let elements: std::collections::BTreeMap<Text, Text> =
        value.map(|v| (compact_str::format_compact!("{v:#010x}"), Text::default())).into_iter().collect();
    *set = Set { elements: elements.into(), ..set.clone() };
}

/// The generation `table` holds (its `fw-epoch` element).
pub fn stamped(table: &Table) -> Option<u32> {
    let set = table.sets.get(EPOCH_SET)?;
    let (key, _) = set.elements.iter().next()?;
    u32::from_str_radix(key.strip_prefix("0x")?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fill_the_mask_and_masks_are_checked() {
        assert_eq!(values(0x0300_0000).collect::<Vec<_>>(), [0x0100_0000, 0x0200_0000, 0x0300_0000]);
        assert_eq!(values(0x0000_0070).count(), 7);
        assert_eq!(values(0).count(), 0);
        assert!(check_mask(0, 0x00ff_0000).is_ok());
        assert!(check_mask(0x0300_0000, 0x00ff_0000).is_ok());
        assert!(check_mask(0x0100_0000, 0).unwrap_err().contains("two bits"));
        assert!(check_mask(0x0500_0000, 0).unwrap_err().contains("contiguous"));
        assert!(check_mask(0x0003_0000, 0x00ff_0000).unwrap_err().contains("EgressIP"));
    }

    #[test]
    fn a_stamp_is_the_epoch_sets_only_element() {
        let mut t = Table::new("t");
        stamp(&mut t, Some(0x0100_0000));
        assert!(t.sets.is_empty(), "no set, nothing stamped");
        t.sets.insert(EPOCH_SET.into(), Set::new(super::super::KeyType::Mark, false));
        assert_eq!(stamped(&t), None);
        stamp(&mut t, Some(0x0200_0000));
        assert_eq!(stamped(&t), Some(0x0200_0000));
        assert_eq!(t.sets[EPOCH_SET].elements.len(), 1);
        stamp(&mut t, Some(0x0100_0000));
        assert_eq!(stamped(&t), Some(0x0100_0000));
        assert_eq!(t.sets[EPOCH_SET].elements.len(), 1);
        stamp(&mut t, None);
        assert_eq!(stamped(&t), None);
    }
}
