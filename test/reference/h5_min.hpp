// The few HDF5 calls the reference tests need to hand data to a Python script and read its
// answers back (serial C API, no dependency on the project's HDF5 layer).
#pragma once
#include <hdf5.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace stratagem::test {

inline void h5_check(herr_t status, const std::string& what) {
  if (status < 0) throw std::runtime_error("HDF5: " + what);
}

inline void write_dataset(hid_t loc, const std::string& name, hid_t type, const void* data,
                          std::vector<hsize_t> dims) {
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds =
      H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds < 0) throw std::runtime_error("HDF5: cannot create " + name);
  h5_check(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write " + name);
  H5Dclose(ds);
  H5Sclose(space);
}

inline void write_string_attr(hid_t loc, const std::string& name, const std::string& value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, value.size());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  h5_check(H5Awrite(attr, type, value.data()), "attr " + name);
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

inline std::vector<double> read_doubles(hid_t file, const std::string& name) {
  const hid_t ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (ds < 0) throw std::runtime_error("HDF5: reference output lacks " + name);
  const hid_t space = H5Dget_space(ds);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<double> v(static_cast<size_t>(n));
  h5_check(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "read " + name);
  H5Sclose(space);
  H5Dclose(ds);
  return v;
}

}  // namespace stratagem::test
