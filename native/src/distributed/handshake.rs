//! Start-up agreement: before any gradient is exchanged, every process
//! checks that it built the same model as rank 0. A mismatch would
//! otherwise surface as MPI errors about message sizes, or as silently
//! wrong training when the totals happen to agree.

use kiln_core::{Error, Result};

use super::comm::Comm;

/// `entries` are (what, description) pairs such as ("parameter '0.weight'",
/// "[128, 64] f32"), in a fixed order. Every process returns the same
/// result: Ok when all lists equal rank 0's, else an error naming the first
/// entry where the lowest-ranked disagreeing process differs. Collective.
#[track_caller]
pub fn check_same_state(comm: &Comm, entries: &[(String, String)]) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let encode = |list: &[(String, String)]| -> Vec<u8> {
        list.iter().map(|(what, desc)| format!("{what}\t{desc}")).collect::<Vec<_>>().join("\n").into_bytes()
    };
    let reference_bytes = comm.broadcast_bytes(0, &encode(entries));
    let reference: Vec<(String, String)> = String::from_utf8_lossy(&reference_bytes)
        .split('\n')
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (what, desc) = line.split_once('\t').unwrap_or((line, ""));
            (what.to_string(), desc.to_string())
        })
        .collect();
    let first_difference = (0..entries.len().max(reference.len())).find(|&i| entries.get(i) != reference.get(i));
    let mine = first_difference.map_or(-1i64, |i| i as i64);
    let all = comm.all_gather(&[mine, entries.len() as i64]);
    let Some(rank) = (0..comm.size()).find(|&r| all[2 * r] >= 0) else { return Ok(()) };
    let index = all[2 * rank] as usize;
    let count = all[2 * rank + 1] as usize;
    let theirs = comm.broadcast_bytes(
        rank,
        entries.get(index).map(|(what, desc)| format!("{what} {desc}")).unwrap_or_default().as_bytes(),
    );
    let theirs = String::from_utf8_lossy(&theirs).into_owned();
    let describe = |entry: Option<&(String, String)>| match entry {
        Some((what, desc)) => format!("{what} {desc}"),
        None => "nothing".to_string(),
    };
    let theirs = if theirs.is_empty() { "nothing".to_string() } else { theirs };
    Err(Error::invalid(
        "DataParallel::new",
        format!(
            "the processes built different models: at entry {index} rank 0 has {} but rank {rank} has {theirs} \
             ({} entries on rank 0, {count} on rank {rank}); every process must build the same model with the same options",
            describe(reference.get(index)),
            reference.len(),
        ),
    ))
}
