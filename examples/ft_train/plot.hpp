// The ft_train chart: loss and the model's metric (test accuracy, perplexity) against step,
// fault-free and faulty runs on one PNG (gnuplot). Torch-free.
#pragma once

#include <string>

namespace monarch::ft::example {

/// Reads two JSONL metrics files and renders `png_path` (1000x800, two panels: loss on top,
/// `metric` below; fault-free solid, faulty dashed) with gnuplot.
///
/// Metrics lines (one JSON object per line; other lines and fields are ignored):
///   {"step": <int>, "loss": <number>}            -> a loss point (loss: mean training loss of
///                                                   the committed step)
///   {"step": <int>, "<metric>": <number>}        -> a metric point ("accuracy", 0..1, is drawn in
///                                                   percent; others, e.g. "perplexity", as is)
///   both fields may share one line.
///   {"step": <int>, "fault": "<kind>"}           -> in the faulty file: a dashed vertical line at
///                                                   that step labelled with the kind
/// Writes <png_path>.gnuplot and the extracted columns (<png_path>.fault_free.dat,
/// <png_path>.faulty.dat) next to the PNG and keeps them (rerun `gnuplot <png_path>.gnuplot`).
/// Throws std::runtime_error if a file cannot be read, a line is not JSON, or gnuplot fails
/// (the message says `apt-get install gnuplot-nox` when gnuplot is missing).
void plot_loss_accuracy(const std::string& fault_free_jsonl, const std::string& faulty_jsonl,
                        const std::string& png_path, const std::string& title = "ft_train",
                        const std::string& metric = "accuracy");

/// Writes `text` to `path` (truncating it), or, with `text` null, only checks that it can: run
/// at start-up so that a bad --json-summary fails before training, not after. Throws
/// std::runtime_error naming `flag`, `path` and the reason (a directory, a missing parent, no
/// permission, a full disk). Any thread.
void write_file(const std::string& flag, const std::string& path, const std::string* text);

/// Creates directory `path` and its parents (nothing when it exists). Throws std::runtime_error
/// naming `flag`, `path` and the reason (a regular file in the way, no permission). Any thread.
void make_dir(const std::string& flag, const std::string& path);

}  // namespace monarch::ft::example
