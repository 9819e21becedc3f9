//! The boxed future the kernel's object-safe traits return.

use std::future::Future;
use std::pin::Pin;

/// A boxed future, for traits used as objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
