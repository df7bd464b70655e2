//! The worker pool the tree writers share (the synthetic set, IDX import): a few scoped threads
//! that take every `threads`-th item each, stop early once one fails, and return the first
//! failure. Each item is written from its own inputs alone, so how the work is divided cannot
//! change any file.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Why [`for_each`] stopped: an item's own error, or a thread that could not start or panicked
/// (which each caller names in its own words).
#[derive(Debug)]
pub enum Stopped<E> {
    Failed(E),
    Spawn(io::Error),
    Panicked,
}

/// Runs `work(index, item)` for every item on 2 to 4 threads (no more than there are items),
/// named `<name>-<n>`.
pub fn for_each<T, E, F>(name: &str, items: &[T], work: F) -> Result<(), Stopped<E>>
where
    T: Sync,
    E: Send,
    F: Fn(usize, &T) -> Result<(), E> + Sync,
{
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 4)
        .min(items.len().max(1));
    let failed = AtomicBool::new(false);
    let work = &work;
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(threads);
        let mut first_error = None;
        for t in 0..threads {
            let failed = &failed;
            let spawned = std::thread::Builder::new().name(format!("{name}-{t}")).spawn_scoped(
                scope,
                move || -> Result<(), Stopped<E>> {
                    for (index, item) in items.iter().enumerate().skip(t).step_by(threads) {
                        // Another worker failed: the temporary tree will be discarded anyway.
                        if failed.load(Ordering::Relaxed) {
                            break;
                        }
                        if let Err(err) = work(index, item) {
                            failed.store(true, Ordering::Relaxed);
                            return Err(Stopped::Failed(err));
                        }
                    }
                    Ok(())
                },
            );
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    failed.store(true, Ordering::Relaxed);
                    first_error = Some(Stopped::Spawn(err));
                    break;
                }
            }
        }
        for handle in handles {
            let result = handle.join().unwrap_or(Err(Stopped::Panicked));
            if let (Err(err), None) = (result, &first_error) {
                first_error = Some(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn every_item_is_done_once_with_its_index() {
        let done = Mutex::new(Vec::new());
        let items: Vec<u32> = (0..37).map(|i| i * 10).collect();
        for_each("test", &items, |index, item| -> Result<(), ()> {
            done.lock().unwrap().push((index, *item));
            Ok(())
        })
        .unwrap();
        let mut done = done.into_inner().unwrap();
        done.sort();
        assert_eq!(done, items.iter().enumerate().map(|(i, &v)| (i, v)).collect::<Vec<_>>());
        // No items, no work and no error.
        for_each("test", &[] as &[u32], |_, _| -> Result<(), ()> { panic!("no item") }).unwrap();
    }

    #[test]
    fn a_failure_or_a_panic_is_returned() {
        let items: Vec<u32> = (0..20).collect();
        let err =
            for_each("test", &items, |_, &item| if item == 13 { Err(item) } else { Ok(()) }).unwrap_err();
        assert!(matches!(err, Stopped::Failed(13)), "{err:?}");
        let err = for_each("test", &items, |_, &item| -> Result<(), ()> {
            assert_ne!(item, 7, "a bug in a worker");
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, Stopped::Panicked), "{err:?}");
    }
}
