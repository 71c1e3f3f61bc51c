//! Writing whole metric families from a custom collector: the sums of the shards, encoded at
//! scrape time through `prometheus-client`'s encoders (never hand-formatted text).
//!
//! Names are given without the suffixes the encoder adds: a counter named `netdam_instructions`
//! is exposed as `netdam_instructions_total`, a histogram `netdam_service_time` with unit
//! seconds as `netdam_service_time_seconds`, an info `netdam_build` as `netdam_build_info`.

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::shard::HistogramSnapshot;

/// The labels of one series: name and value pairs.
pub type Labels = Vec<(&'static str, String)>;

/// No labels.
pub fn no_labels() -> Labels {
    Vec::new()
}

/// One label.
pub fn label(name: &'static str, value: impl Into<String>) -> Labels {
    vec![(name, value.into())]
}

/// A counter family with one series per `(labels, value)`.
pub fn counters(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, value) in series {
        family.encode_family(&labels)?.encode_counter::<NoLabelSet, u64, u64>(&value, None)?;
    }
    Ok(())
}

/// A gauge family with one series per `(labels, value)`.
pub fn gauges(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (Labels, f64)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, value) in series {
        family.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// A latency histogram family (unit seconds) with one series per `(labels, snapshot)`.
pub fn histograms(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, HistogramSnapshot)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (labels, snapshot) in series {
        snapshot.encode(&mut family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// An info metric: one series of value 1 carrying `labels`.
pub fn info(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, labels: Labels) -> std::fmt::Result {
    encoder.encode_descriptor(name, help, None, MetricType::Info)?.encode_info(&labels)
}
