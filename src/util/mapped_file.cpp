#include "util/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "util/error.h"

namespace lilac {

int open_regular_file(const std::string& path, size_t& size) {
  if (path.size() > PATH_MAX)
    fail("{}...: the path is longer than {} bytes", path.substr(0, 64), PATH_MAX);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file ({})", path,
         S_ISFIFO(st.st_mode)   ? "a FIFO"
         : S_ISCHR(st.st_mode)  ? "a character device"
         : S_ISBLK(st.st_mode)  ? "a block device"
         : S_ISDIR(st.st_mode)  ? "a directory"
         : S_ISSOCK(st.st_mode) ? "a socket"
                                : "a special file");
  }
  size = size_t(st.st_size);
  return fd;
}

std::string read_small_file(const std::string& path, size_t max_bytes) {
  size_t size = 0;
  const int fd = open_regular_file(path, size);
  if (size > max_bytes) {
    ::close(fd);
    fail("{}: {} bytes is more than this file may have ({})", path, size, max_bytes);
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      fail("{}: read error: {}", path, n == 0 ? "file shrank while read" : std::strerror(e));
    }
    got += size_t(n);
  }
  ::close(fd);
  return out;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  size_t size = 0;
  const int fd = open_regular_file(path, size);
  size_ = size;
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  release();
}

void MappedFile::drop_pages(size_t offset, size_t n) const {
  if (!data_ || offset >= size_) return;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page;  // whole pages only: neighbours stay
  const size_t end = std::min(size_, offset + n) / page * page;
  if (end > begin) ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_DONTNEED);
}

void MappedFile::release() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

}  // namespace lilac
