#pragma once
// The names of enum values: one table per enum and one convention for every conversion
// between an hmc enum and its text (report fields, scenario values, CLI values, wire formats).
// Those names are contracts: a table entry changes only with the format that holds it.
//
// An enum takes part by declaring, next to the enum and in its namespace (so that
// argument-dependent lookup finds it), its table and what the enum is called in messages:
//
//   inline constexpr EnumName<Transport> kTransportNames[] = {
//       {Transport::kAuto, "auto"}, {Transport::kThreads, "threads"}, ...};
//   constexpr EnumTable<Transport> enumTable(Transport) {
//     return {"transport", kTransportNames};
//   }
//
// A table lists every enumerator once, in declaration order (values 0, 1, 2, ...), each with
// a distinct non-empty name; the functions below check this at compile time. Then:
//
//   enumName(value)        its name; "unknown" for a value outside the table. noexcept.
//   enumFromName<E>(name)  its value, or nullopt for an unknown name. noexcept.
//   parseEnum<E>(name)     its value; for an unknown name throws hmc::ValueError:
//                          "unknown <what> '<name>' (expected one of: a, b, c)".
//   enumNames<E>()         every name, in table order (CLI11's IsMember, messages).
//
// Names match exactly (case-sensitive). Everything here is thread-safe and torch-free.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hmc {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// A view of one enum's table and what the enum is called in messages ("transport").
template <typename E>
class EnumTable {
 public:
  template <std::size_t N>
  constexpr EnumTable(std::string_view what, const EnumName<E> (&entries)[N]) noexcept
      : what_(what), entries_(entries), size_(N) {}

  constexpr std::string_view what() const noexcept { return what_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr const EnumName<E>& operator[](std::size_t i) const noexcept { return entries_[i]; }
  constexpr const EnumName<E>* begin() const noexcept { return entries_; }
  constexpr const EnumName<E>* end() const noexcept { return entries_ + size_; }

 private:
  std::string_view what_;
  const EnumName<E>* entries_;
  std::size_t size_;
};

namespace detail {

// Values 0..size-1 in order, names non-empty and distinct.
template <typename E>
constexpr bool isDenseTable(EnumTable<E> table) noexcept {
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (static_cast<std::size_t>(table[i].value) != i || table[i].name.empty()) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (table[j].name == table[i].name) return false;
    }
  }
  return true;
}

template <typename E>
constexpr EnumTable<E> checkedTable() noexcept {
  constexpr EnumTable<E> table = enumTable(E{});
  static_assert(isDenseTable(table),
                "an enum's name table must list every value once, in declaration order, each "
                "with a distinct non-empty name");
  return table;
}

[[noreturn]] void throwUnknownEnumName(std::string_view what, std::string_view name,
                                       const std::vector<std::string_view>& names);

}  // namespace detail

template <typename E>
constexpr std::string_view enumName(E value) noexcept {
  constexpr EnumTable<E> table = detail::checkedTable<E>();
  const auto index = static_cast<std::size_t>(value);
  return index < table.size() ? table[index].name : std::string_view("unknown");
}

template <typename E>
constexpr std::optional<E> enumFromName(std::string_view name) noexcept {
  for (const EnumName<E>& entry : detail::checkedTable<E>()) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

template <typename E>
std::vector<std::string> enumNames() {
  std::vector<std::string> names;
  for (const EnumName<E>& entry : detail::checkedTable<E>()) names.emplace_back(entry.name);
  return names;
}

template <typename E>
E parseEnum(std::string_view name) {
  if (const std::optional<E> value = enumFromName<E>(name)) return *value;
  constexpr EnumTable<E> table = detail::checkedTable<E>();
  std::vector<std::string_view> names;
  for (const EnumName<E>& entry : table) names.push_back(entry.name);
  detail::throwUnknownEnumName(table.what(), name, names);
}

}  // namespace hmc
