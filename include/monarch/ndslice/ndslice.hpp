// Umbrella header for the ndslice layer: Extent, Point, Slice, Shape/View, Region, Selection,
// ValueMesh.
#pragma once

#include "monarch/ndslice/error.hpp"
#include "monarch/ndslice/extent.hpp"
#include "monarch/ndslice/point.hpp"
#include "monarch/ndslice/region.hpp"
#include "monarch/ndslice/selection.hpp"
#include "monarch/ndslice/shape.hpp"
#include "monarch/ndslice/slice.hpp"
#include "monarch/ndslice/value_mesh.hpp"
