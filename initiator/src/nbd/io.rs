//! The few async I/O helpers the server needs, over tokio's `AsyncRead`/`AsyncWrite` polling
//! methods (the crate does not enable tokio's `io-util`): a buffered reader of exact-length
//! frames whose refill is cancel-safe, and whole-buffer writes.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reads exact-length frames through a fixed buffer. Small frames (headers, options) come from
/// the buffer, so one system call usually brings several; a frame at least as large as the
/// buffer is read straight into its destination.
pub(crate) struct FrameReader<R> {
    inner: R,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader with a buffer of `buffer_bytes`.
    pub(crate) fn new(inner: R, buffer_bytes: usize) -> FrameReader<R> {
        assert!(buffer_bytes > 0, "a reader needs a buffer");
        FrameReader { inner, buffer: vec![0u8; buffer_bytes].into_boxed_slice(), start: 0, end: 0 }
    }

    /// Bytes read from the stream but not yet taken.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Reads whatever the stream has into the buffer; `Ok(0)` at the end of the stream.
    /// Cancel-safe: if the future is dropped, no byte is lost.
    pub(crate) async fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        // Callers take every buffered byte before asking for more, so there is room.
        debug_assert!(self.end < self.buffer.len(), "fill on a full buffer");
        let read = read_some(&mut self.inner, &mut self.buffer[self.end..]).await?;
        self.end += read;
        Ok(read)
    }

    /// Fills `out` completely, or fails with `UnexpectedEof` if the stream ends first.
    pub(crate) async fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        let mut done = self.take_buffered(out);
        while done < out.len() {
            let read = if out.len() - done >= self.buffer.len() {
                let read = read_some(&mut self.inner, &mut out[done..]).await?;
                done += read;
                read
            } else {
                let read = self.fill().await?;
                done += self.take_buffered(&mut out[done..]);
                read
            };
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the client closed the connection {done} bytes into a {}-byte message", out.len()),
                ));
            }
        }
        Ok(())
    }

    /// Reads and drops `len` bytes (the payload of a refused request).
    pub(crate) async fn discard(&mut self, len: u64) -> io::Result<()> {
        let mut left = len;
        loop {
            let take = (self.buffered() as u64).min(left) as usize;
            self.start += take;
            left -= take as u64;
            if left == 0 {
                return Ok(());
            }
            if self.fill().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the client closed the connection {} bytes into a {len}-byte payload", len - left),
                ));
            }
        }
    }

    fn take_buffered(&mut self, out: &mut [u8]) -> usize {
        let take = self.buffered().min(out.len());
        out[..take].copy_from_slice(&self.buffer[self.start..self.start + take]);
        self.start += take;
        take
    }
}

/// One read into `out`; `Ok(0)` at the end of the stream.
async fn read_some<R: AsyncRead + Unpin>(reader: &mut R, out: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| {
        let mut buffer = ReadBuf::new(out);
        match Pin::new(&mut *reader).poll_read(cx, &mut buffer) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(buffer.filled().len())),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Writes every byte of `data`.
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(writer: &mut W, data: &[u8]) -> io::Result<()> {
    write_all_vectored(writer, &mut [IoSlice::new(data)]).await
}

/// Writes every byte of `parts`, in order, with vectored writes.
pub(crate) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    writer: &mut W,
    parts: &mut [IoSlice<'_>],
) -> io::Result<()> {
    let mut parts = parts;
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        let written = poll_fn(|cx| Pin::new(&mut *writer).poll_write_vectored(cx, parts)).await?;
        if written == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "the connection accepts no more data"));
        }
        IoSlice::advance_slices(&mut parts, written);
    }
    Ok(())
}

/// Flushes and shuts down the write side (sends FIN on a socket).
pub(crate) async fn shutdown<W: AsyncWrite + Unpin>(writer: &mut W) -> io::Result<()> {
    poll_fn(|cx| Pin::new(&mut *writer).poll_flush(cx)).await?;
    poll_fn(|cx| Pin::new(&mut *writer).poll_shutdown(cx)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its data in the given slices, one per read.
    struct Trickle(Vec<Vec<u8>>);

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if !self.0.is_empty() {
                let mut piece = self.0.remove(0);
                let take = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..take]);
                if take < piece.len() {
                    self.0.insert(0, piece.split_off(take));
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
    }

    #[test]
    fn frames_span_reads_and_buffers() {
        block_on(async {
            let data: Vec<u8> = (0..=255).collect();
            let pieces = data.chunks(7).map(<[u8]>::to_vec).collect();
            let mut reader = FrameReader::new(Trickle(pieces), 16);
            let mut small = [0u8; 10];
            reader.read_exact(&mut small).await.unwrap();
            assert_eq!(small, data[..10]);
            reader.discard(20).await.unwrap();
            let mut large = [0u8; 100];
            reader.read_exact(&mut large).await.unwrap();
            assert_eq!(large, data[30..130]);
            let mut rest = vec![0u8; 126];
            reader.read_exact(&mut rest).await.unwrap();
            assert_eq!(rest, data[130..]);
            let mut more = [0u8; 1];
            let error = reader.read_exact(&mut more).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(reader.fill().await.unwrap(), 0);
        });
    }

    #[test]
    fn discard_past_the_end_is_an_error() {
        block_on(async {
            let mut reader = FrameReader::new(Trickle(vec![vec![1, 2, 3]]), 8);
            let error = reader.discard(4).await.unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        });
    }
}
