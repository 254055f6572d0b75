# Writes and installs colony.pc and colony-static.pc at install time (install(SCRIPT), set up in
# CMakeLists.txt), so that it names the prefix the files really go to:
# `cmake --install <build> --prefix <dir>` may choose another one than the
# configure step's CMAKE_INSTALL_PREFIX.
set(CO_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CO_PC_${kind}_REL}")
    set(CO_PC_${kind} "${CO_PC_${kind}_REL}")
  else()
    set(CO_PC_${kind} "\${prefix}/${CO_PC_${kind}_REL}")
  endif()
endforeach()
configure_file("${CO_PC_IN}" "${CO_PC_OUT}" @ONLY)
configure_file("${CO_PC_STATIC_IN}" "${CO_PC_STATIC_OUT}" @ONLY)
if(IS_ABSOLUTE "${CO_PC_LIBDIR_REL}")
  set(pcdir "${CO_PC_LIBDIR_REL}/pkgconfig")
else()
  set(pcdir "${CMAKE_INSTALL_PREFIX}/${CO_PC_LIBDIR_REL}/pkgconfig")
endif()
file(INSTALL "${CO_PC_OUT}" "${CO_PC_STATIC_OUT}" DESTINATION "${pcdir}")
