//! The dead-letter store: messages firstseen will not forward (oversized,
//! unrouted) are written here, fsynced, before they are acked upstream.

use std::path::PathBuf;

use tokio::io::AsyncWriteExt;

/// Files in `<data_dir>/dead-letter/`, one per message: a JSON header line,
/// then the raw payload.
#[derive(Clone)]
pub struct DeadLetter {
    dir: PathBuf,
}

#[derive(serde::Serialize)]
struct Header<'a> {
    reason: &'a str,
    topic: &'a str,
    qos: u8,
    retain: bool,
    bytes: usize,
    received_ms: u64,
}

impl DeadLetter {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Stores one message durably and returns the file's path.
    pub async fn store(
        &self,
        reason: &str,
        topic: &str,
        qos: u8,
        retain: bool,
        payload: &[u8],
        received_ms: u64,
    ) -> std::io::Result<PathBuf> {
        if !self.dir.is_dir() {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || firstseen_store::disk::create_dir_durable(&dir))
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
        }
        let digest = blake3::hash(payload).to_hex();
        let path = self
            .dir
            .join(format!("{received_ms}-{}.msg", &digest.as_str()[..16]));
        let header = Header {
            reason,
            topic,
            qos,
            retain,
            bytes: payload.len(),
            received_ms,
        };
        let mut line = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // Written under a temporary name and renamed, so a crash or a full
        // disk never leaves a partial file that looks like a message; the
        // directory is synced so the name survives a power cut. Only then
        // is the message acked.
        let tmp = path.with_extension("partial");
        let written = async {
            let mut f = tokio::fs::File::create(&tmp).await?;
            f.write_all(&line).await?;
            f.write_all(payload).await?;
            f.sync_all().await?;
            tokio::fs::rename(&tmp, &path).await?;
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
                .await
                .map_err(std::io::Error::other)?
        }
        .await;
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e);
        }
        Ok(path)
    }
}
